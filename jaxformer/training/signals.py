"""SIGTERM and Ctrl-C during training: save a checkpoint at the next step boundary, then stop.

Once the run's work is done, its checkpoints closed (orbax's writes waited for) and its final
choice made or left to the same command, a signal has nothing left to save: the run notes it
(end_signals.py), and from before the run's handlers are given back to the process's end (the
summary, Python's exit) the launcher's take them (commands/launch.py), which keep the exit code,
0 for a finished run, as nothing is lost.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

logger = logging.getLogger(__name__)


class _SignalHandler:
    """A context in which SIGTERM and SIGINT (or the `signums` given) call `_handle`; the previous
    handlers come back on exit, where `_handle` is still in place (one installed since, a caller's
    taking over with no moment between, stays). Outside the main thread signals are left alone."""

    def __init__(self, signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
        self._signums = signums
        self._previous = {}

    def __enter__(self):
        for signum in self._signums:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        raise NotImplementedError

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler)


class StopRequest(_SignalHandler):
    """`with StopRequest() as stop:` records the first SIGTERM / SIGINT (`stop.signum`) instead
    of dying; a second Ctrl-C stops at once. Outside the main thread signals are left alone."""

    def __init__(self):
        super().__init__()
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def agreed(self) -> bool:
        """Whether the run stops, asked at a point every process reaches (the loop's start and end,
        before the final choice). One process: when it received a signal, with no collective.
        Several: when any of them did, in a collective at each call, so that all leave the loop
        together and save together (a process that stopped alone would wait in the checkpoint's
        collectives for ever); the others then take its signal as their own. Between steps the
        loop asks only at the steps of its one exchange (step_exchange.py's `stops_after`)."""
        if jax.process_count() == 1:
            return self.requested
        return self.agreed_by(np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0))))

    def agreed_by(self, signums: np.ndarray) -> bool:
        """Whether the run stops, given every process's signal number (0: none) gathered at a step
        they share (`agreed`, or the training loop's one exchange: step_exchange.py): when any
        process received one; the others then take its signal as their own."""
        if signums.max() and self.signum is None:
            self.signum = int(signums.max())
            logger.warning("%s received by another process: saving a checkpoint and stopping", self.signal_name)
        return bool(signums.max())

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = int(signum)
        logger.warning("%s", stop_message(self.signal_name, jax.process_count()))


def stop_message(signal_name: str, process_count: int) -> str:
    """What the training loop does on a signal it takes as a request to stop. One comes anywhere in
    a step (its compilation included), in the evaluation or BLEU after it, or between steps; the
    loop asks after each step's work, so that step (between steps: the next) and the work due at it
    end first; with several processes, the step at which they next exchange signals and its work."""
    if process_count == 1:
        when = "once the step under way (between steps: the next one) and"
    else:
        when = "at the next step at which all processes exchange signals, once it and"
    work = "any evaluation, BLEU or checkpoint due at it are done"
    return f"{signal_name} received: stopping {when} {work}; a checkpoint is saved"


class Stopped(BaseException):
    """A SIGTERM or SIGINT that arrived during work a signal cannot wait for (the final choice).
    Not an `Exception`, as KeyboardInterrupt is not: the `except Exception` that reads a damaged
    checkpoint as one to skip (checkpoint.py) must not take a stop for damage and set aside the
    checkpoints after it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Where a signal's exception is held back: JAX, XLA's compiler and orbax's writers call back into
# Python from C++ that does not expect one (JAX then crashes at exit, SIGSEGV, instead of exiting
# with 128 + the signal's number); logging prints and drops an exception raised while it writes a
# record; one raised during an import leaves a module half made, and one raised while a thread
# pool shuts down leaves a thread running JAX at exit (abort).
_HOLDING_MODULES = frozenset(
    {
        "jax",
        "jaxlib",
        "flax",
        "optax",
        "orbax",
        "absl",
        "logging",
        "tqdm",
        "importlib",  # the frozen importlib._bootstrap too
        "threading",
        "concurrent",
    }
)
# Code that runs as a callback of an object's end (a weakref's, a finalizer's, a `__del__`), often
# inside a garbage collection: Python prints an exception raised there ("Exception ignored in") and
# drops it, so a signal that comes there is held as inside the libraries.
_CALLBACK_MODULES = frozenset({"weakref", "_weakrefset"})
_RETRY_SECONDS = 0.05


def _inside_libraries(frame) -> bool:
    """Whether the interrupted code, or any of its callers, is one of _HOLDING_MODULES' or a
    callback of an object's end (_CALLBACK_MODULES', or a `__del__`)."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] in _HOLDING_MODULES or module in _CALLBACK_MODULES:
            return True
        if getattr(frame, "f_code", None) is not None and frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class RaiseOnSignal(_SignalHandler):
    """`with RaiseOnSignal() as signals:` turns SIGTERM and SIGINT into `Stopped`, where no step
    boundary comes soon enough to stop at (the final choice decodes the validation split for
    minutes; a run prepares its data and compiles); outside the main thread signals are left
    alone. A signal that interrupts JAX (a compilation, say) or orbax, or a callback of an
    object's end (a weakref's, a `__del__`: Python prints and drops an exception raised there), is
    raised as soon as that call returns (the signal is sent again every 50 ms until then), never
    inside it; signals after the first are not raised (the stop's clean-up runs). A `Stopped` that
    Python dropped all the same (raised in a callback not known as one) is not printed, and the
    signal is sent again likewise. One that came but was not raised (held until the block's work
    ended) is raised by `check()`, which the block calls where its work ends. Once that work is
    done (an export in place), `finish()` turns later signals into a note: `late_signum`, raised
    no more. `signums=(signal.SIGINT,)` leaves SIGTERM its handler (a command that it ends at once).

    `until`, with several processes (jax.process_count() > 1): a signal is held, said with `until`
    (where the processes stop), and `check()`, which every process calls at the same points, stops
    all of them when any received one; a process that stopped alone left the others waiting in
    their collectives until jax's distributed timeout aborted them (5 minutes, exit 134), itself
    included. A second Ctrl-C stops at once."""

    def __init__(self, signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT), until: str | None = None):
        super().__init__(signums)
        # Without jax.distributed there is one process; asking jax would start its backend for nothing.
        several = until is not None and jax.distributed.is_initialized() and jax.process_count() > 1
        self._until = until if several else None
        self.signum: int | None = None
        self._raised = False  # Stopped raised for `signum`
        self._closed = False
        self._finished = False
        self.late_signum: int | None = None  # the first signal after `finish()`
        self._retry: threading.Timer | None = None
        self._previous_unraisable_hook = None

    def __enter__(self):
        self._previous_unraisable_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return super().__enter__()

    def _handle(self, signum, frame) -> None:
        if self._finished:  # nothing left to stop
            self.late_signum = self.late_signum or int(signum)
            return
        if self._raised:  # the stop is under way: another exception would break off its clean-up
            return
        if self._until is not None:
            if self.signum is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            if self.signum is None:
                self.signum = int(signum)
                logger.warning("%s received: stopping %s, with every process of the run", self.signal_name, self._until)
            return
        self.signum = int(signum)
        if _inside_libraries(frame):
            self._send_later(int(signum))
            return
        self._raised = True
        raise Stopped(self.signum)

    def _send_later(self, signum: int) -> None:
        self._retry = threading.Timer(_RETRY_SECONDS, self._send_again, (signum,))
        self._retry.daemon = True
        self._retry.start()

    def _unraisable(self, unraisable) -> None:
        """sys.unraisablehook in the block: this handler's `Stopped`, which Python dropped (it was
        raised in a callback), is not a stop under way: its signal is sent again, to be raised in
        ordinary code. Anything else goes to the hook that was in place."""
        stop = unraisable.exc_value
        if isinstance(stop, Stopped) and self._raised and stop.signum == self.signum and not self._closed:
            self._raised = False
            self._send_later(stop.signum)
            return
        self._previous_unraisable_hook(unraisable)

    def _send_again(self, signum: int) -> None:
        if self._closed:
            return
        if signal.getsignal(signum) != self._handle:  # a nested handler is in place (a training loop's): it acts
            self.signum = None
        os.kill(os.getpid(), signum)

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def check(self) -> None:
        """Raises `Stopped` if a signal came (its exception held, or lost on the way); with `until`
        and several processes, if one came to any of them (every process calls it at this point)."""
        if self._until is not None and not self._finished:
            signums = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
            if signums.max() and self.signum is None:
                self.signum = int(signums.max())
                logger.warning("%s received by another process: stopping %s", self.signal_name, self._until)
        if self.signum is not None:
            self._raised = True
            raise Stopped(self.signum)

    def finish(self) -> None:
        """The work that a signal would stop is done: one that comes from now on (or came and is
        held, not raised yet) is kept in `late_signum` and not raised."""
        self._finished = True
        if self._retry is not None:
            self._retry.cancel()
        if self.signum is not None and not self._raised:
            self.late_signum, self.signum = self.signum, None

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        if sys.unraisablehook == self._unraisable:  # else another replaced it since: theirs to restore
            sys.unraisablehook = self._previous_unraisable_hook
        super().__exit__(exc_type, exc, traceback)
        # A signal held inside a library call that then failed (a download that ends in a network
        # error) would be lost with the error on its way out: the stop asked for wins.
        if self.signum is not None and not self._raised and isinstance(exc, Exception):
            self._raised = True
            failure = " ".join(f"{type(exc).__name__}: {exc}".split())
            name = signal.Signals(self.signum).name
            logger.warning("%s: the work it came during then failed (%s); stopping", name, failure)
            raise Stopped(self.signum) from exc
