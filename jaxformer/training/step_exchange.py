"""What the processes of a run tell each other every BUDGET_CHECK_STEPS steps of training, in one
collective: whether a checkpoint save under way has failed in any of them (run/save_barrier.py
acts on it), whether process 0 failed to write the run's metrics (metrics.py's MetricWriter holds
that failure until here) and the signal any of them received (signals.py acts on it).

A failed save and a signal were each a `process_allgather` of its own at the same steps: two
round trips through every process where one carries both. A failure is raised before a stop is
acted on: a run stopped by a signal would otherwise save an interim checkpoint after it.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.run.save_barrier import failure_seen, raise_failed_save
from jaxformer.training.metrics import MetricWriter
from jaxformer.training.signals import StopRequest


def stops_after(step: int, every: int, stop: StopRequest, checkpointer, writer: MetricWriter) -> bool:
    """Whether the run stops after `step`. One process: when it received a signal, at any step,
    with no collective. Several: every `every` steps, in every process at once, raises a save of
    `checkpointer`'s under way that failed in any process (its own error in the one that failed,
    SaveFailedElsewhereError in the others), then a write of process 0's `writer` that failed (its
    error there, MetricsFailedElsewhereError in the others), else stops every process when any
    received a signal."""
    if jax.process_count() == 1:
        return stop.requested
    if step % every:
        return False
    mine = np.array([failure_seen(checkpointer.barrier), writer.held is not None, stop.signum or 0], np.int32)
    gathered = np.asarray(multihost_utils.process_allgather(mine))  # [P, 3]: failed save seen, write held, signal
    raise_failed_save(checkpointer.barrier, checkpointer.wait, gathered[:, 0])
    writer.raise_held(gathered[:, 1])
    return stop.agreed_by(gathered[:, 2])


def raise_held_write(writer: MetricWriter) -> None:
    """With several processes, a collective at a point every process shares besides the exchanges of
    `stops_after` (before a checkpoint: none is saved after a record that was not written; after
    the loop's last records): raises a write that failed in process 0 in every process."""
    if jax.process_count() > 1:
        writer.raise_held(np.asarray(multihost_utils.process_allgather(np.int32(writer.held is not None))))
