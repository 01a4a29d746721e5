"""How a process of a multi-process run ends once its command failed: with its own exit code,
within seconds, whether or not every other process of the run is still there to leave with it.

As Python exits, jax waits for every process of the run at its shutdown barrier
(jax.distributed.shutdown, one of jax's exit callbacks). A process killed (kill -9) never comes:
each survivor, its `error:` line written, waited there for it until jax's heartbeat timeout
(100 s by default) failed the barrier and aborted the survivor (exit -6), where its exit code
would have said what happened (2). A failed command now waits at that barrier for a bounded time
(`end_within_bound`): where every process comes (each of them failed too, the failure told), the
barrier passes and the process ends as any other does; where one never comes, the process ends
with its own exit code once the time is up (os._exit, its output flushed). Process 0 holds jax's
coordination service, and a process that loses it is aborted at once (exit -6, perhaps before its
own `error:` line): process 0 waits longer than the others, so that every survivor has left
first. A run that finished, or stopped on a signal (every process stops at the same step and
leaves with the others), waits for every process as before.

This module imports the standard library alone: `launch` loads it before jax.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

# The seconds a failed process waits at its exit for the others. The survivors of a process killed
# in a save or a step stop at the same barrier or exchange, within 2 s of each other (measured with
# two and three processes): process 0 outlasts every other survivor's wait by more than that.
OTHERS_WAIT_SECONDS = 2.0
COORDINATOR_WAIT_SECONDS = 10.0

_joined: list[int] = []  # this process's index in the multi-process run it joined, once it has


def joined_run(process_index: int, process_count: int) -> None:
    """This process has joined a run of `process_count` processes as `process_index` (train.py's
    jax.distributed.initialize returned)."""
    _joined[:] = [process_index] if process_count > 1 else []


def failed(code: int) -> bool:
    """Whether exit code `code` ends a failed command: 0 is done, 128 and above a signal's stop."""
    return 0 < code < 128


def end_within_bound(code: int) -> None:
    """In a process that joined a multi-process run and failed with exit code `code`: from now on,
    the process ends with `code` once its wait for the others is up, unless it has ended by then
    (jax's shutdown barrier passed). Anywhere else, nothing."""
    if not (_joined and failed(code)):
        return
    seconds = COORDINATOR_WAIT_SECONDS if _joined[0] == 0 else OTHERS_WAIT_SECONDS
    # A daemon thread: Python's exit does not wait for it, and it still runs while jax's exit
    # callback waits at the barrier, which lets other threads run (it holds no lock of Python's).
    timer = threading.Timer(seconds, _end, args=(code,))
    timer.daemon = True
    timer.name = "jaxformer-failed-exit"
    timer.start()


def _end(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):  # what they hold: os._exit writes nothing out
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(code)
