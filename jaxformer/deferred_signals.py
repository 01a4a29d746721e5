"""SIGTERM and SIGINT held back while a few file-system calls run that a signal must not split: a
folder made and its name not yet kept (a staging folder, a probe), two renames that put a folder in
place. Each is short: the signal is raised as soon as they end, to the handler in place then."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT received inside are raised again on leaving, to the handlers then in
    place. (Blocking them would not do: another thread, jax's, would take them.) Outside the main
    thread signals are left alone."""
    received, previous = [], {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
        for signum in received:
            signal.raise_signal(signum)
