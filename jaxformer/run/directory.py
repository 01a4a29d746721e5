"""The layout of a training run's directory (the workdir), in one place.

    <workdir>/
        lock                  held by the training run using the workdir (run/lock.py)
        tokenizer.model       the sentencepiece model, trained once (also inside every checkpoint);
                              with separate vocabularies, the source side's
        tokenizer.target.model   separate vocabularies only: the target side's
        checkpoints/<step>/   the newest checkpoints: train state, data iterator, metadata
        best/<step>/          the parameters with the best validation BLEU so far
        averaged/<step>/      the mean parameters of the last N checkpoints (average_checkpoints)
        metrics.jsonl         one JSON record per logged step (train/..., eval/...)
        tensorboard/          TensorBoard event files of the same metrics
        last_metrics.json     the metrics of the run's last step, written when it ends

Each `<step>/` directory is an orbax checkpoint (run/checkpoint.py) whose metadata follows
run/metadata.py. Only paths here: nothing is read, created or locked.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

CHECKPOINT_KINDS = ("latest", "best", "averaged")  # what --checkpoint names, besides a step number


@dataclasses.dataclass(frozen=True)
class RunDirectory:
    """The paths of one run's directory; `RunDirectory(workdir)` takes a str or any path-like
    (a `RunDirectory` included), and is itself path-like."""

    path: pathlib.Path

    def __post_init__(self):
        object.__setattr__(self, "path", pathlib.Path(self.path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def lock_file(self) -> pathlib.Path:
        return self.path / "lock"

    @property
    def tokenizer_file(self) -> pathlib.Path:
        return self.path / "tokenizer.model"

    @property
    def target_tokenizer_file(self) -> pathlib.Path:
        """The target side's sentencepiece model, when the run has separate vocabularies."""
        return self.path / "tokenizer.target.model"

    @property
    def checkpoints(self) -> pathlib.Path:
        """The newest checkpoints of the train state ("latest")."""
        return self.path / "checkpoints"

    @property
    def best(self) -> pathlib.Path:
        """The best parameters by validation BLEU ("best")."""
        return self.path / "best"

    @property
    def averaged(self) -> pathlib.Path:
        """The parameters averaged over the last checkpoints ("averaged")."""
        return self.path / "averaged"

    def checkpoint_directory(self, which: str) -> pathlib.Path:
        """`checkpoints` for "latest", `best` for "best", `averaged` for "averaged"."""
        if which not in CHECKPOINT_KINDS:
            raise ValueError(f"checkpoint {which!r}: choose one of {', '.join(CHECKPOINT_KINDS)} or a step number")
        return {"latest": self.checkpoints, "best": self.best, "averaged": self.averaged}[which]

    @property
    def metrics_file(self) -> pathlib.Path:
        """metrics.jsonl: one JSON object per line, {"step", "time", "<prefix>/<metric>": value, ...}."""
        return self.path / "metrics.jsonl"

    @property
    def tensorboard_dir(self) -> pathlib.Path:
        return self.path / "tensorboard"

    @property
    def last_metrics_file(self) -> pathlib.Path:
        return self.path / "last_metrics.json"
