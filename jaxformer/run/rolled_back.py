"""The steps of best/, averaged/ and final/ after the checkpoint a run resumes from, set aside as
`<step>.rolled_back-<time>` before it trains on.

A run resumed from a checkpoint older than the newest (the newest damaged, or removed; none at all
for a run started again from scratch) trains those steps again, and the history that wrote its
steps after it is not continued: their metrics records move to metrics.rolled_back.jsonl
(training/metrics.py), and so do their parameters here, never deleted. Else `--checkpoint best`,
`averaged` or `final`, the run's summary and its final choice would take a model of that history
for the run's: a final choice made at the step it ends at again would be kept as if made by it.
"""

from __future__ import annotations

import logging
import pathlib

from jaxformer.run.directory import RunDirectory
from jaxformer.run.interrupted_saves import finish_interrupted_saves, interrupted_replacements, set_aside_path
from jaxformer.run.lock import AveragingLock, WorkdirLockedError
from jaxformer.run.process_0 import on_process_0

logger = logging.getLogger(__name__)

# The folders of parameters a run's history wrote; averaged/ first, so that a refusal of its lock moves nothing.
ROLLED_BACK_KINDS = ("averaged", "best", "final")


def _steps_after(directory: pathlib.Path, start_step: int) -> list[int]:
    """The step folders of `directory` after `start_step`, a step whose replacement was interrupted
    (`<step>.replacing` alone, which its writer puts back: `interrupted_replacements`) among them."""
    if not directory.is_dir():
        return []
    steps = {int(entry.name) for entry in directory.iterdir() if entry.name.isdigit() and entry.is_dir()}
    return sorted(step for step in steps | interrupted_replacements(directory).keys() if step > start_step)


def _since(start_step: int, checkpoint: str = "the checkpoint this run resumed from") -> str:
    if start_step >= 0:
        return f"after step {start_step}, {checkpoint}"
    return "of an earlier run with no checkpoint to resume from"


def _averaging_lock(run: RunDirectory, start_step: int, since: str) -> AveragingLock:
    """averaged.lock, held, to move averaged/'s steps after `start_step`; while an averaging holds
    it, a `WorkdirLockedError` naming it and those steps."""
    lock = AveragingLock(run)
    try:
        lock.acquire()
    except WorkdirLockedError as error:
        later = ", ".join(map(str, _steps_after(run.averaged, start_step)))
        raise WorkdirLockedError(f"cannot set aside step(s) {later} of {run.averaged}, {since}: {error}") from None
    return lock


def check_averaged_movable(run: RunDirectory, newest_step: int) -> None:
    """Before anything is prepared: `set_aside_rolled_back`'s refusal while an averaging holds
    averaged.lock, for averaged/'s steps after `newest_step` (the newest checkpoint whose metadata
    reads; -1 for none), which the run sets aside whichever checkpoint restores: found after the
    restore, it came after the data, the tokenizers and the state were prepared. A step up to
    `newest_step` is known to be after the one restored only once its arrays prove damaged: that
    refusal stays where it was. Process 0 checks; every process raises."""
    if not _steps_after(run.averaged, newest_step):
        return
    since = _since(newest_step, "the newest checkpoint this run can resume from")
    on_process_0(run.averaged, lambda: _averaging_lock(run, newest_step, since).release(), "take averaged.lock")


def set_aside_rolled_back(run: RunDirectory, start_step: int) -> None:
    """Moves the steps of best/, averaged/ and final/ after `start_step` (the checkpoint a run
    resumed from; -1 for a new run) to `<step>.rolled_back-<time>`, each with a warning; process 0
    moves. An interrupted save in one of those folders is finished first, as its next writer does.
    averaged/ is average_checkpoints' to write: its steps are moved holding averaged.lock, and
    while an averaging holds it, a `WorkdirLockedError` naming it and what waits to be moved, before
    anything is. Called before BleuValidator reads best/'s score (a new score is compared
    with what best/ keeps) and before the final choice looks for one already made at its step."""
    since = _since(start_step)

    def move(kind: str) -> None:
        directory = run.checkpoint_directory(kind)
        finish_interrupted_saves(directory)
        for step in _steps_after(directory, start_step):
            target = set_aside_path(directory, step, "rolled_back")
            (directory / str(step)).rename(target)
            logger.warning(
                "moved %s to %s: a step %s, which this run trains again; %s/ keeps only the steps of the "
                "history it goes on from",
                *(directory / str(step), target, since, kind),
            )

    def move_averaged() -> None:
        lock = _averaging_lock(run, start_step, since)
        try:
            move("averaged")
        finally:
            lock.release()

    for kind in ROLLED_BACK_KINDS:
        directory = run.checkpoint_directory(kind)
        if _steps_after(directory, start_step):  # averaged.lock is taken only where there is something to move
            change = move_averaged if kind == "averaged" else lambda kind=kind: move(kind)
            on_process_0(directory, change, f"set its steps after step {start_step} aside")


def rolled_back_steps(directory: pathlib.Path) -> dict[int, list[pathlib.Path]]:
    """{step: its `<step>.rolled_back-<time>` folders} in `directory`: the steps `set_aside_rolled_back`
    moved there, of a history a resumed run trained again."""
    found: dict[int, list[pathlib.Path]] = {}
    if directory.is_dir():
        for path in sorted(directory.glob("*.rolled_back-*")):
            step = path.name.partition(".")[0]
            if step.isdigit() and path.is_dir():
                found.setdefault(int(step), []).append(path)
    return found


def rolled_back_note(directory: pathlib.Path) -> str:
    """For a reader's refusal of `directory` holding no step: the steps set aside there as rolled
    back (`rolled_back_steps`), which is why, when there are any."""
    found = rolled_back_steps(directory)
    if not found:
        return ""
    names = ", ".join(str(path) for paths in found.values() for path in paths)
    return (
        f"; its step(s) {', '.join(map(str, found))} were set aside ({names}) when the run resumed from an earlier "
        "checkpoint (or from none) and trained those steps again"
    )
