"""SIGTERM and Ctrl-C during training: save a checkpoint at the next step boundary, then stop."""

from __future__ import annotations

import logging
import signal

import jax
import numpy as np
from jax.experimental import multihost_utils


class _SignalHandler:
    """A context in which SIGTERM and SIGINT call `_handle`; the previous handlers come back on
    exit. Outside the main thread signals are left alone."""

    def __init__(self):
        self._previous = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        raise NotImplementedError

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
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

    def agreed(self, step: int, every: int = 1) -> bool:
        """Whether the run stops after `step`. One process: when it received a signal. Several:
        when any of them did, as exchanged every `every` steps (the same steps in each, so all
        leave the loop together and save together; a process that stopped alone would wait in
        the checkpoint's collectives for ever); the others then take its signal as their own."""
        if jax.process_count() == 1:
            return self.requested
        if step % every:
            return False
        signums = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
        if signums.max() and self.signum is None:
            self.signum = int(signums.max())
            logging.warning("%s received by another process: saving a checkpoint and stopping", self.signal_name)
        return bool(signums.max())

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = int(signum)
        when = "after this step" if jax.process_count() == 1 else "at the next step all processes agree on"
        logging.warning("%s received: saving a checkpoint and stopping %s", self.signal_name, when)


class Stopped(BaseException):
    """A SIGTERM or SIGINT that arrived during work a signal cannot wait for (the final choice).
    Not an `Exception`, as KeyboardInterrupt is not: the `except Exception` that reads a damaged
    checkpoint as one to skip (checkpoint.py) must not take a stop for damage and set aside the
    checkpoints after it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RaiseOnSignal(_SignalHandler):
    """`with RaiseOnSignal() as signals:` turns SIGTERM and SIGINT into `Stopped`, where no step
    boundary comes soon enough to stop at (the final choice decodes the validation split for
    minutes); outside the main thread signals are left alone. The signal is also kept
    (`signals.signum`): a handler that runs inside a garbage-collection callback has its exception
    printed and dropped by Python, so the block calls `check()` where work ends, to raise it again."""

    def __init__(self):
        super().__init__()
        self.signum: int | None = None

    def _handle(self, signum, frame) -> None:
        self.signum = int(signum)
        raise Stopped(self.signum)

    def check(self) -> None:
        """Raises `Stopped` if a signal came and its exception was lost on the way."""
        if self.signum is not None:
            raise Stopped(self.signum)
