"""Which of a run's checkpoints (in `<workdir>/checkpoints`) stay: the last
`training.keep_checkpoints` scheduled ones, and an interim one (saved to stop between scheduled
steps) until the next checkpoint replaces it.

Orbax applies the keep rule (its max_to_keep) only inside a save. A run resumed at its end (killed
after its last checkpoint, before orbax removed the oldest) saves nothing, so the run's end
applies the rule itself: a stopped and resumed run ends with the checkpoints, and the average, of
one never stopped. best/ and final/ are other folders, with rules of their own.

A run resumed with a lower keep than it was keeping would delete, at its next checkpoint (or its
end), checkpoints the higher keep was holding for averaging (training.average_last,
jaxformer-average-checkpoints): it is refused before any work (`check_keep_not_lowered`), and the
user who wants fewer moves those checkpoints aside first.
"""

from __future__ import annotations

import logging

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer

logger = logging.getLogger(__name__)


def is_interim(checkpointer: Checkpointer, step: int) -> bool:
    """Whether checkpoint `step` was saved to stop between scheduled checkpoints (a signal, unreadable data)."""
    try:
        return checkpointer.read_metadata(step).interim
    except CheckpointError:  # unreadable: not this module's to delete as interim
        return False


def remove_interim_before(checkpointer: Checkpointer, step: int) -> None:
    """Deletes the interim checkpoints before `step`, whose checkpoint supersedes them. Every
    process calls it (orbax's delete is collective; process 0 deletes)."""
    for earlier in checkpointer.steps():
        if earlier < step and is_interim(checkpointer, earlier):
            logger.info("removing the interim checkpoint %d (saved to stop early): %d follows it", earlier, step)
            checkpointer.delete(earlier)


def remove_beyond_keep(checkpointer: Checkpointer, keep: int) -> list[int]:
    """Deletes the scheduled checkpoints older than the newest `keep` of them, as orbax's save
    would have; interim ones stay (the next checkpoint deletes them), as they do in a save.
    Returns the steps deleted. Every process calls it (orbax's delete is collective)."""
    steps = checkpointer.steps()
    if len(steps) <= keep:
        return []
    scheduled = [step for step in steps if not is_interim(checkpointer, step)]
    removed = scheduled[: max(len(scheduled) - keep, 0)]
    for step in removed:
        logger.info("removing checkpoint %d: the run keeps its last %d (training.keep_checkpoints)", step, keep)
        checkpointer.delete(step)
    return removed


def lost_by_lowering(scheduled: list[int], kept_before: int, keep: int, saves_again: bool) -> list[int]:
    """Of the `scheduled` checkpoints (their steps, oldest first), those that keeping `keep`
    instead of `kept_before` deletes and `kept_before` would have kept: at the next save when the
    run `saves_again` (orbax keeps the newest `keep`, the new one among them), else at the run's
    end (remove_beyond_keep)."""

    def removed(kept: int) -> list[int]:
        room = kept - 1 if saves_again else kept
        return scheduled[: max(len(scheduled) - room, 0)]

    return [step for step in removed(keep) if step not in removed(kept_before)]


def check_keep_not_lowered(
    checkpointer: Checkpointer, kept_before: int, keep: int, saves_again: bool, resumed_from: int
) -> None:
    """`CheckpointError` when a resumed run keeping `keep` checkpoints, where it kept `kept_before`,
    would delete some of those `kept_before` keeps: named, with the two ways on. The checkpoint it
    resumes from is not counted: moved aside, the run would resume from an older one, and a keep of
    1 replaces it with the next, as in any run keeping 1."""
    if keep >= kept_before:
        return
    scheduled = [step for step in checkpointer.steps() if not is_interim(checkpointer, step)]
    lost = [step for step in lost_by_lowering(scheduled, kept_before, keep, saves_again) if step != resumed_from]
    if lost:
        when = "its next checkpoint" if saves_again else "its end (it trains no further)"
        steps = ", ".join(str(step) for step in lost)
        first = checkpointer.directory / str(lost[0])
        raise CheckpointError(
            f"training.keep_checkpoints={keep}, lowered from the run's {kept_before}: {when} would delete checkpoint "
            f"{steps} of {checkpointer.directory}, which it keeps for averaging; restore "
            f"training.keep_checkpoints={kept_before}, or move those aside yourself (e.g. {first} to "
            f"{first}.kept) to keep fewer"
        )
