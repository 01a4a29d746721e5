"""What the processes of a run tell each other every BUDGET_CHECK_STEPS steps of training, in one
collective: whether a checkpoint save under way has failed in any of them (run/save_barrier.py
acts on it) and the signal any of them received (signals.py acts on it).

Each was a `process_allgather` of its own at the same steps: two round trips through every
process where one carries both. A failed save is raised before a stop is acted on: a run
stopped by a signal would otherwise save an interim checkpoint beside the one that failed.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.run.save_barrier import failure_seen, raise_failed_save
from jaxformer.training.signals import StopRequest


def stops_after(step: int, every: int, stop: StopRequest, checkpointer) -> bool:
    """Whether the run stops after `step`. One process: when it received a signal, at any step,
    with no collective. Several: every `every` steps, in every process at once, raises a save of
    `checkpointer`'s under way that failed in any process (its own error in the one that failed,
    SaveFailedElsewhereError in the others), else stops every process when any received a signal."""
    if jax.process_count() == 1:
        return stop.requested
    if step % every:
        return False
    mine = np.array([failure_seen(checkpointer.barrier), stop.signum or 0], np.int32)
    gathered = np.asarray(multihost_utils.process_allgather(mine))  # [P, 2]: failure seen, signal number
    raise_failed_save(checkpointer.barrier, checkpointer.wait, gathered[:, 0])
    return stop.agreed_by(gathered[:, 1])
