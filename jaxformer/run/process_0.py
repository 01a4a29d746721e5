"""A change to a checkpoint folder that process 0 alone makes (a rename: every process renaming
the one folder, all but the first would find it gone), each process returning once it is made.

Process 0 tells the others its outcome, its error's first line included: a barrier in its place
left them waiting for a process 0 that had failed until jax's distributed timeout, minutes later.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.errors import CheckpointError, first_line

_REASON_BYTES = 1024  # of process 0's error, passed on to the others whole up to this length


def on_process_0(directory: pathlib.Path, change: Callable[[], object], doing: str) -> None:
    """`change()` of `directory` (`doing` it) by process 0 alone, every process returning once it is
    made. If it fails, process 0 raises its error and the others at once a CheckpointError quoting
    it."""
    failure = None
    if jax.process_index() == 0:
        try:
            change()
        except Exception as error:  # noqa: BLE001  (a bug too: the others must not wait for process 0)
            failure = error
    if jax.process_count() > 1:
        reason = "" if failure is None else first_line(failure)
        sent = reason.encode()[:_REASON_BYTES].ljust(_REASON_BYTES, b"\0")
        failed, told = multihost_utils.broadcast_one_to_all(
            (np.int32(failure is not None), np.frombuffer(sent, np.uint8))
        )
        if failure is None and int(failed):
            told = bytes(np.asarray(told)).rstrip(b"\0").decode(errors="replace")
            raise CheckpointError(f"process 0 could not {doing} in {directory} ({told})")
    if failure is not None:
        raise failure
