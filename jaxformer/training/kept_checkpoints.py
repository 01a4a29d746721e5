"""Which of a run's checkpoints (in `<workdir>/checkpoints`) stay: the last
`training.keep_checkpoints` scheduled ones, and an interim one (saved to stop between scheduled
steps) until the next checkpoint replaces it.

Orbax applies the keep rule (its max_to_keep) only inside a save. A run resumed at its end (killed
after its last checkpoint, before orbax removed the oldest) saves nothing, so the run's end
applies the rule itself: a stopped and resumed run ends with the checkpoints, and the average, of
one never stopped. best/ and final/ are other folders, with rules of their own.
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
