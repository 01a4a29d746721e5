"""A given sentencepiece model (tokenizer.model_path or target_model_path) whose size contradicts
tokenizer.vocab_size. On a new run the value is what is wrong. On a resume, where the workdir's
tokenizer (converted from that file when the run started) has tokenizer.vocab_size pieces, the
file changed since the run: setting the value the error offered would be refused as another
configuration than the run's, so the error names the changed file instead, with the remedies the
resume's own check gives one of the same size (run_tokenizer.py): restore the file, or resume with
the workdir's copy."""

from __future__ import annotations

import os
import pathlib

import ml_collections

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.errors import UserError
from jaxformer.model.config import ConfigError
from jaxformer.run.directory import RunDirectory


class GivenModelSizeError(ConfigError):
    """tokenizer.vocab_size contradicts the given models: `sizes`, each one's key ("model_path",
    "target_model_path") -> its size converted (jaxformer's special pieces added)."""

    def __init__(self, message: str, sizes: dict[str, int]):
        super().__init__(message)
        self.sizes = sizes


def changed_since_the_run(
    error: GivenModelSizeError, config: ml_collections.ConfigDict, workdir: str | os.PathLike | None
) -> ConfigError:
    """`error`, or where `workdir` holds the tokenizer of one of its keys with tokenizer.vocab_size
    pieces (the run's conversion of that model, when the run started), the error naming that
    key's file as changed since the run."""
    if workdir is None:
        return error
    run = RunDirectory(workdir)
    files = {"model_path": run.tokenizer_file, "target_model_path": run.target_tokenizer_file}
    for key, given in error.sizes.items():
        path = pathlib.Path(files[key])
        try:
            pieces = Tokenizer.load(path).vocab_size if path.is_file() else None
        except (UserError, OSError):  # not a tokenizer the run wrote: the resume's checks name it
            continue
        if pieces == config.tokenizer.vocab_size:
            return ConfigError(
                f"tokenizer.{key} {config.tokenizer[key]} converts to {given} pieces, but {path}, the workdir's "
                f"conversion of the model its run started with, has {pieces} (tokenizer.vocab_size={pieces}, "
                f"as the run was trained): the file changed since, or it is another model; restore that file, "
                f"or leave tokenizer.{key} unset to resume with the workdir's copy, or use a new workdir"
            )
    return error
