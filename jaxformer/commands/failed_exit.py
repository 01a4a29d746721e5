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

A process whose step fails in a collective exchange because the process at its other end went
(gloo's connection reset or closed: that process killed, or ended by an error of its own, which
now leaves within seconds) says so in one line (`lost_process`, through run_command), where it
printed gloo's traceback. A process that loses process 0 cannot: jax's client aborts it at once,
in a thread of its own (exit -6, no line). The client that jaxlib makes takes a callback for that
instead of its abort (missed_heartbeat_callback), but jax.distributed.initialize passes none, and
jaxlib 0.10 cannot call one written in Python (its status argument fails to convert: std::bad_cast,
and the process ends as before), measured.

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

_joined: list[int] = []  # this process's index and the process count of the multi-process run it joined

# What gloo (the CPU processes' collectives) says where a process it exchanges with has gone: its
# connection reset (killed) or closed (ended) in the middle of an exchange.
_GLOO_PEER_GONE = ("Connection reset by peer", "Connection closed by peer")


def joined_run(process_index: int, process_count: int) -> None:
    """This process has joined a run of `process_count` processes as `process_index` (train.py's
    jax.distributed.initialize returned)."""
    _joined[:] = [process_index, process_count] if process_count > 1 else []


def lost_process(error: BaseException) -> str | None:
    """The one line that says a process of this run is gone, where `error` is a collective exchange's
    (jax's runtime error, from gloo) whose other end went (a process killed, or ended alone by an error
    of its own): process 0 saw its exchange fail with a traceback. None for any other error. Of two
    processes the other one is named; of more, gloo names an address alone."""
    text = str(error).strip()
    if not (_joined and text.startswith("UNKNOWN: Gloo ") and any(gone in text for gone in _GLOO_PEER_GONE)):
        return None
    index, count = _joined
    which = f"process {1 - index}" if count == 2 else "another process"
    return (
        f"{which} of the run is gone (killed, or ended by an error of its own, which its log says): "
        f"{text.splitlines()[0]}; run the same command again to resume from the last checkpoint"
    )


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
