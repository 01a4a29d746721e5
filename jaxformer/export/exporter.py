"""A training run's checkpoint as a self-contained export directory (`jaxformer-export`).

The export is written into a temporary directory beside the output and moved into place once
complete and read back, so a crash never leaves half an export (jaxformer/staged_folder.py stages
and moves it; output_folder.py checks the output). The program is the search the settings name:
beam search, greedy search or sampling (program.py). A non-empty output is replaced only when
asked to (`overwrite`), and only if it is an export itself. Its contents are listed in
jaxformer/export/standalone.py, which is copied into it as serve.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import pathlib
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxformer import staged_folder
from jaxformer.decoding.checkpoint_alpha import SEARCH_NAMES, ChosenSearch, checkpoint_search
from jaxformer.decoding.generate import DecodeSettings, check_seed, decoding_variant
from jaxformer.decoding.translator import source_token_limit
from jaxformer.errors import CheckpointError
from jaxformer.export import output_folder, standalone
from jaxformer.export.loading import ExportError, check_export
from jaxformer.export.program import KNOWN_PLATFORMS, PLATFORMS, export_search, fixed_settings, key_impl, key_spec
from jaxformer.export.safetensors import flatten, unflatten, write_safetensors
from jaxformer.model.config import ConfigError
from jaxformer.run.directory import parse_checkpoint_choice
from jaxformer.run.loading import load_checkpoint, require_architecture
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)

PARAMETERS_FILE = "params.safetensors"
TOKENIZER_FILE = "tokenizer.model"  # the shared vocabulary's, or the source side's
TARGET_TOKENIZER_FILE = "tokenizer.target.model"  # with separate vocabularies only
# The program's file, by decoding method: a beam search export's keeps the name it always had.
PROGRAM_FILES = {"beam": "beam_search.jaxexport", "greedy": "greedy_search.jaxexport", "sample": "sampling.jaxexport"}
PACKAGE_FOLDER = pathlib.Path(standalone.__file__).parents[1]  # jaxformer/, where LOADER_IMPORTS are


@dataclasses.dataclass(frozen=True)
class ServingSettings:
    """How the loader batches sentences. length_bucket and max_source_tokens default to
    `Translator`'s; batch_size to 64, twice Translator's 32."""

    batch_size: int = 64  # rows per decoding batch
    length_bucket: int = 16  # source lengths are rounded up to a multiple of this
    # Longer sentences are translated in pieces. None: 256, or the model's positions where fewer;
    # more than its positions is refused (`source_token_limit`), as translate refuses it.
    max_source_tokens: int | None = None

    @property
    def max_source_length(self) -> int:
        """The longest source row the program takes: max_source_tokens, rounded up to the bucket."""
        return self.length_bucket * math.ceil(self.max_source_tokens / self.length_bucket)


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    directory: pathlib.Path
    step: int
    platforms: tuple[str, ...]  # the program's
    failed: dict[str, str]  # platforms asked for whose lowering failed, and why


def export_checkpoint(
    workdir: str | os.PathLike,
    output: str | os.PathLike,
    checkpoint: str | int = "latest",
    settings: DecodeSettings | None = None,
    serving: ServingSettings = ServingSettings(),
    *,
    platforms: Sequence[str] = PLATFORMS,
    overwrite: bool = False,
    on_placed: Callable[[], None] | None = None,
    chosen: ChosenSearch | None = None,
    seed: int = 0,
    settle_search: Callable[[ChosenSearch | None], DecodeSettings] | None = None,
) -> ExportSummary:
    """Exports `checkpoint` of the run in `workdir` ("latest", "best", "averaged", "final" or a step) into
    the directory `output`, for the search `settings` name (beam search, greedy search or sampling)
    on `platforms` (those whose lowering
    fails are left out and reported in the summary and config.json; no `settings`: DecodeSettings()
    with, on "final", the beam search the run's final choice was made with and the alpha it chose,
    as `Translator.from_workdir`). `seed`: a sampling export's default seed, which serve.py's
    --seed overrides (`Translator`'s seed: one key per batch split from it). `on_placed()` is
    called once the export is in place, before a signal that came during the final move is raised
    again (the export command takes one from then on as late: its work is done). `chosen`: final/'s
    `chosen_search`, when the caller read it already; `settle_search`: in place of `settings`, the
    search given final/'s `chosen_search` (None on another checkpoint), settled from the one read of
    the checkpoint's metadata (the export command's flags), as `Translator.from_workdir` takes it.
    The checkpoint is read once: the model and the search are checked from its metadata before its
    parameters are read, and before anything is staged."""
    checkpoint = parse_checkpoint_choice(checkpoint)  # before anything on disk is looked at
    try:
        output = pathlib.Path(output).absolute()  # "." has no parent to stage beside
    except FileNotFoundError:  # a relative path in a removed folder
        raise ExportError(f"--output {output}: the current folder no longer exists; cd to one that does") from None
    check_seed(seed)
    unknown = sorted(set(platforms) - set(KNOWN_PLATFORMS))
    if unknown or not platforms:
        raise ExportError(f"platforms {', '.join(unknown) or '(none)'}: choose among {', '.join(KNOWN_PLATFORMS)}")
    repeated = sorted({platform for platform in platforms if list(platforms).count(platform) > 1})
    if repeated:
        raise ExportError(f"platforms {', '.join(platforms)}: {', '.join(repeated)} given more than once")
    staged_folder.remove_dead_leftovers(output, output_folder.EXPORT)
    output_folder.check_output(output, overwrite)
    settled = {}  # the last checkpoint's settled: "latest" is settled again where a damaged newest is skipped

    def settle(metadata) -> None:  # from the one read of its metadata, before the parameters or anything lowered
        model_config = require_architecture(
            workdir,
            checkpoint,
            "encoder_decoder",
            "an export holds a translator's search and needs an encoder_decoder one",
            ExportError,
            metadata=metadata,
        )
        settled["settings"] = checkpoint_search(
            workdir, checkpoint, metadata, model_config, settings, chosen, settle_search, method="beam"
        )
        try:
            limit = source_token_limit(serving.max_source_tokens, model_config)
        except ConfigError as error:
            raise ExportError(str(error)) from None
        settled["serving"] = dataclasses.replace(serving, max_source_tokens=limit)

    step, metadata, params = load_checkpoint(workdir, checkpoint, before_params=settle)
    settings, serving = settled["settings"], settled["serving"]
    with staged_folder.staging_directory(output, output_folder.EXPORT) as staging:
        config, params = decoding_variant(metadata.model_config(), params)
        separate = metadata.target_tokenizer is not None  # separate source and target vocabularies
        for side, model_size, tokenizer in (
            ("source" if separate else "shared", config.encoder_vocab_size, metadata.load_tokenizer()),
            *([("target", config.vocab_size, metadata.load_target_tokenizer())] if separate else []),
        ):
            if tokenizer.vocab_size != model_size:
                raise CheckpointError(
                    f"step {step} of {workdir}: the model's {side} vocabulary has {model_size} tokens, "
                    f"its tokenizer {tokenizer.vocab_size}"
                )
        params = unflatten(flatten(jax.device_get(params)), "the checkpoint")  # plain dicts of host arrays
        logger.info("exporting the %s for %s", SEARCH_NAMES[settings.method], ", ".join(platforms))
        program, failed = export_search(config, settings, params, serving.max_source_length, platforms)
        files = {
            "parameters": write_parameters(staging, params),
            "tokenizer": write_tokenizer(staging, TOKENIZER_FILE, metadata.tokenizer),
            **(
                {"target_tokenizer": write_tokenizer(staging, TARGET_TOKENIZER_FILE, metadata.target_tokenizer)}
                if separate
                else {}
            ),
            "program": write_program(staging, PROGRAM_FILES[settings.method], program),
        }
        shutil.copyfile(standalone.__file__, staging / standalone.LOADER_FILE)
        for module in standalone.LOADER_IMPORTS:
            shutil.copyfile(PACKAGE_FOLDER / module, staging / pathlib.PurePath(module).name)
        description = {
            "format": standalone.FORMAT,
            "format_version": 1 if settings.method == "beam" else standalone.FORMAT_VERSION,
            "model": config.to_dict(),  # the decoding variant, which the parameters are laid out for
            "decoding": decoding_record(settings, seed),
            "special_tokens": {"pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID, "bos": BOS_ID},
            "serving": {**dataclasses.asdict(serving), "max_source_length": serving.max_source_length},
            "checkpoint": {
                "workdir": str(pathlib.Path(workdir).resolve()),
                "which": checkpoint,  # latest, best, averaged or a step number
                "step": step,
                "bleu": metadata.bleu,
                "averaged_steps": metadata.averaged_steps,
            },
            "platforms": list(program.platforms),
            "platforms_failed": failed,
            "program": {
                **program_signature(settings.method),
                "jax_version": jax.__version__,
                "calling_convention_version": program.calling_convention_version,
            },
            "files": {
                **files,
                "loader": {
                    **_file_entry(staging / standalone.LOADER_FILE),
                    "imports": [
                        _file_entry(staging / pathlib.PurePath(module).name) for module in standalone.LOADER_IMPORTS
                    ],
                },
            },
        }
        (staging / standalone.CONFIG_FILE).write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
        check_export(staging)  # what was written reads back: every file, the parameters against the program
        output_folder.check_output(output, overwrite, staging)  # nothing else appeared there meanwhile
        staged_folder.raise_held_signal()
        staged_folder.move_into_place(staging, output, output_folder.EXPORT, on_placed)
    logger.info("wrote %s", output)
    return ExportSummary(output, step, tuple(program.platforms), failed)


def decoding_record(settings: DecodeSettings, seed: int) -> dict[str, Any]:
    """config.json's "decoding": the method and the settings its program holds fixed (`fixed_settings`:
    a beam search's all, as exports have always recorded them; greedy search's and sampling's only
    those they read, no beam size or length penalty), and sampling's default seed, which serve.py
    takes at run time."""
    seed_record = {"seed": seed} if settings.method == "sample" else {}
    return {"method": settings.method, **fixed_settings(settings)} | seed_record


def program_signature(method: str) -> dict[str, str]:
    """config.json's words for the program's inputs and outputs (and sampling's key implementation,
    which serve.py makes its keys with)."""
    source = "params, source int32 [B, S] (0 = padding), 1 <= S <= max_source_length"
    if method == "beam":
        return {
            "inputs": source,
            "outputs": "tokens int32 [B, K, S + max_extra_length], scores float32 [B, K]; K = beam_size",
        }
    outputs = "tokens int32 [B, 1, S + max_extra_length], scores float32 [B, 1] (log p)"
    if method == "greedy":
        return {"inputs": source, "outputs": outputs}
    return {
        "inputs": f"{source}, key uint32 {list(key_spec().shape)}: jax.random.key_data of the batch's {key_impl()} key",
        "outputs": outputs,
        "key_impl": key_impl(),
    }


# -- the files -------------------------------------------------------------------------------


def _file_entry(path: pathlib.Path) -> dict[str, str]:
    with open(path, "rb") as handle:
        return {"name": path.name, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}


def write_parameters(directory: pathlib.Path, params: Any) -> dict[str, str]:
    path = directory / PARAMETERS_FILE
    write_safetensors(path, flatten(params), metadata={"format": standalone.FORMAT})
    return _file_entry(path)


def write_tokenizer(directory: pathlib.Path, name: str, model_proto: bytes) -> dict[str, str]:
    """A sentencepiece model proto, as the checkpoint holds it."""
    path = directory / name
    path.write_bytes(model_proto)
    return _file_entry(path)


def write_program(directory: pathlib.Path, name: str, program: jax.export.Exported) -> dict[str, str]:
    try:
        data = program.serialize()
    except ImportError as error:  # jax serializes with flatbuffers, which it does not require
        raise ExportError(f"serializing the program needs the flatbuffers package ({error})") from None
    path = directory / name
    path.write_bytes(data)
    return _file_entry(path)
