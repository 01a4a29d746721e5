"""SIGTERM and Ctrl-C during training: save a checkpoint at the next step boundary, then stop."""

from __future__ import annotations

import logging
import signal


class StopRequest:
    """`with StopRequest() as stop:` records the first SIGTERM / SIGINT (`stop.signum`) instead
    of dying; a second Ctrl-C stops at once. Outside the main thread signals are left alone."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def __enter__(self) -> StopRequest:
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = int(signum)
        logging.warning("%s received: saving a checkpoint and stopping after this step", self.signal_name)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
