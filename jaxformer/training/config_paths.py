"""The paths a run stores in its checkpoints' config, made absolute so that resuming, evaluating
or fine-tuning from another directory finds the same files."""

from __future__ import annotations

import copy
import os

import ml_collections

from jaxformer.files import home_expanded

PATH_KEYS = (
    "data.data_dir",
    "data.raw_dir",
    "data.files.train",
    "data.files.validation",
    "data.files.test",
    "tokenizer.model_path",
    "tokenizer.target_model_path",
    "training.init_from",
    "training.init_encoder_from",
    "training.init_decoder_from",
)


def with_absolute_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` whose PATH_KEYS hold absolute paths, their folders' symbolic links resolved
    ("~" expanded), so that one file given two ways is recorded as one path. Resolved as the system
    does: "link/../x" is x beside the link's target, which a lexical "x" would not be. The last
    part is kept as given: a file that is a link (a git-annex or hub blob) keeps its name."""
    config = copy.deepcopy(config)
    for key in PATH_KEYS:
        *sections, leaf = key.split(".")
        section = config
        for name in sections:
            section = section[name]
        if section[leaf] is not None and "://" not in section[leaf]:  # gs://... and other remote paths stay
            section[leaf] = _absolute(section[leaf])
    return config


def _absolute(path: str) -> str:
    """`path` absolute, its folder resolved as the system resolves it and its last part kept: a
    data file's name (.tsv, .gz, {lang}) is read as given, even where the file is a link."""
    path = home_expanded(path)
    path = path.rstrip(os.sep) or os.sep
    folder, name = os.path.split(path)
    if name in ("", ".", ".."):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(folder or os.curdir), name)
