"""The layout of a training run's directory (the workdir), in one place.

    <workdir>/
        lock                  held by the training run using the workdir (run/lock.py)
        tokenizer.model       the sentencepiece model, trained once (also inside every checkpoint);
                              with separate vocabularies, the source side's
        tokenizer.target.model   separate vocabularies only: the target side's
        checkpoints/<step>/   the newest checkpoints: train state, data iterator, metadata
        best/<step>/          the parameters with the best validation BLEU so far
        averaged/<step>/      the mean parameters of the last N checkpoints (average_checkpoints)
        averaged.lock         held by the average_checkpoints writing averaged/ (run/lock.py)
        final/<step>/         the parameters the run chose at its end (training.final_choice):
                              latest, best or averaged, by validation BLEU
        metrics.jsonl         one JSON record per logged step (train/..., eval/..., budget/...)
        metrics.rolled_back.jsonl   the records of steps after the checkpoint a run resumed from,
                              which it trained again (written only then)
        tensorboard/          TensorBoard event files of the same metrics
        last_metrics.json     the metrics of the run's last step, written when it ends

Beside the `<step>/` directories of checkpoints/, best/, averaged/ and final/ may lie
`<step>.damaged-<time>/` (a checkpoint that could not be restored, set aside for inspection and
never deleted), `<step>.replaced-<time>/` (one a new checkpoint of its step replaced), in best/,
averaged/ and final/ `<step>.rolled_back-<time>/` (a step after the checkpoint a run resumed from,
which that run trains again: run/rolled_back.py) and, after a process was killed while saving,
`<step>.replacing/` (the whole previous version of a step being replaced, which the folder's next
writer puts back: run/interrupted_saves.py) and orbax's `<step>.orbax-checkpoint-tmp*` (never
readable; the folder's next writer removes it).

Each `<step>/` directory is an orbax checkpoint (run/checkpoint.py) whose metadata follows
run/metadata.py. A sweep's directory (jaxformer-sweep) holds one such run directory per variant
(`<variant>/`, and `<variant>@seed<k>/` for its other seeds) beside its own entries:

    <sweep workdir>/
        sweep.jsonl           one JSON row per finished variant (and seed)
        sweep.md              the rows as a Markdown table, highest validation BLEU first
        pace/<variant>.json   under --baseline_steps: each variant's measured pace and steps
        sweep.lock            held by the jaxformer-sweep using the directory (run/lock.py)

Only paths here, and `RunDirectory.check_folders`, which looks whether a folder among them is
one: nothing is read, created or locked.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import pathlib

from jaxformer.errors import CheckpointError

CHECKPOINT_KINDS = ("latest", "best", "averaged", "final")  # what --checkpoint names, besides a step number
# What each kind's folder holds, in the refusal of a file where it goes.
_HOLDS = {
    "latest": "checkpoints",
    "best": "best checkpoints",
    "averaged": "averaged checkpoints",
    "final": "final choices",
}


class _Entry:
    """A path inside the run directory: `run.<attribute>` is `run.path / name`."""

    def __init__(self, name: str, doc: str):
        self.name, self.__doc__ = name, doc

    def __get__(self, run: _Directory | None, owner: type | None = None) -> pathlib.Path | _Entry:
        return self if run is None else run.path / self.name


def parse_checkpoint_choice(checkpoint: object) -> str | int:
    """`checkpoint` as the loaders read it: one of CHECKPOINT_KINDS, or a step number as an int,
    which may be given as its digits in a str (as `--checkpoint 300` gives it). A one-line
    TypeError for a bool or anything else that is neither an int nor a str, a ValueError for a
    negative step or a str that is neither: each names the argument and what it takes."""
    choices = f"{', '.join(CHECKPOINT_KINDS)} or a step number"
    if isinstance(checkpoint, str) and checkpoint.isascii() and checkpoint.isdigit():
        checkpoint = int(checkpoint)
    if isinstance(checkpoint, numbers.Integral) and not isinstance(checkpoint, bool):
        if checkpoint < 0:
            raise ValueError(f"checkpoint={checkpoint!r}: a step number is not negative")
        return int(checkpoint)
    if not isinstance(checkpoint, str):
        raise TypeError(f"checkpoint={checkpoint!r}: give {choices} (an int, or its digits as a str)")
    if checkpoint not in CHECKPOINT_KINDS:
        raise ValueError(f"checkpoint {checkpoint!r}: choose one of {choices}")
    return checkpoint


def checkpoint_name(which: str | int) -> str:
    """`--checkpoint` as words: "best checkpoint", or "checkpoint 50" for a step."""
    return f"{which} checkpoint" if which in CHECKPOINT_KINDS else f"checkpoint {which}"


@dataclasses.dataclass(frozen=True)
class _Directory:
    """A directory's paths: made from a str or any path-like (one of these included), and itself path-like."""

    path: pathlib.Path

    def __post_init__(self):
        object.__setattr__(self, "path", pathlib.Path(self.path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)


@dataclasses.dataclass(frozen=True)
class RunDirectory(_Directory):
    """The paths of one run's directory; `RunDirectory(workdir)` takes a str or any path-like
    (a `RunDirectory` included), and is itself path-like."""

    lock_file = _Entry("lock", "held by the training run using the workdir (run/lock.py)")
    tokenizer_file = _Entry("tokenizer.model", "the (source) sentencepiece model")
    target_tokenizer_file = _Entry("tokenizer.target.model", "the target's, when vocabularies are separate")
    checkpoints = _Entry("checkpoints", 'the newest checkpoints of the train state ("latest")')
    best = _Entry("best", 'the best parameters by validation BLEU ("best")')
    averaged = _Entry("averaged", 'the parameters averaged over the last checkpoints ("averaged")')
    averaging_lock_file = _Entry("averaged.lock", "held by the average_checkpoints writing averaged/ (run/lock.py)")
    final = _Entry("final", 'the parameters the run chose at its end by validation BLEU ("final")')
    metrics_file = _Entry("metrics.jsonl", 'one JSON object per line: {"step", "time", "<prefix>/<metric>": value}')
    rolled_back_metrics_file = _Entry(
        "metrics.rolled_back.jsonl", "records of steps after the checkpoint a run resumed from, which it trained again"
    )
    tensorboard_dir = _Entry("tensorboard", "TensorBoard event files of the same metrics")
    last_metrics_file = _Entry("last_metrics.json", "the metrics of the run's last step")

    def checkpoint_directory(self, which: str) -> pathlib.Path:
        """`checkpoints` for "latest", `best` for "best", `averaged` for "averaged", `final` for "final"."""
        if which not in CHECKPOINT_KINDS:
            raise ValueError(f"checkpoint {which!r}: choose one of {', '.join(CHECKPOINT_KINDS)} or a step number")
        return {"latest": self.checkpoints, "best": self.best, "averaged": self.averaged, "final": self.final}[which]

    def check_folders(self, *kinds: str) -> None:
        """`CheckpointError` naming the first folder of `kinds` (CHECKPOINT_KINDS) where something
        else lies (a file, a dangling link): orbax finds out only as it saves there, and the work
        done before is lost. A folder that does not exist yet is fine."""
        for kind in kinds:
            path = self.checkpoint_directory(kind)
            if (path.exists() or path.is_symlink()) and not path.is_dir():
                raise CheckpointError(f"{path} is not a directory, where the {_HOLDS[kind]} go: move it away")


@dataclasses.dataclass(frozen=True)
class SweepDirectory(_Directory):
    """The paths of a sweep's directory, beside its variants' run directories; no variant may be
    named like one of them (nor like one in another case: some filesystems fold case)."""

    rows_file = _Entry("sweep.jsonl", "one JSON row per finished variant (and seed)")
    table_file = _Entry("sweep.md", "the rows as a Markdown table, highest validation BLEU first")
    pace_dir = _Entry("pace", "under --baseline_steps: <variant>.json, each variant's measured pace")
    lock_file = _Entry("sweep.lock", "held by the jaxformer-sweep using the directory (run/lock.py)")
    OWN_NAMES = (rows_file.name, table_file.name, pace_dir.name, lock_file.name)
