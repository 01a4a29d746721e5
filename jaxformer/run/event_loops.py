"""Event loops that finish their tasks before closing, for orbax's restores and a training run's saves.

Orbax runs each restore (and save) in a fresh asyncio event loop and closes it as soon as a read
(a write) fails; the other tensorstore reads or writes still in flight then report to the closed
loop from their threads, and each prints a "RuntimeError: Event loop is closed" traceback. The
loops made here wait for them before they close.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings


class _DrainingEventLoop(asyncio.SelectorEventLoop):
    def close(self) -> None:
        if not self.is_closed() and not self.is_running():
            pending = [task for task in asyncio.all_tasks(self) if not task.done()]
            if pending:
                self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        super().close()


@contextlib.contextmanager
def draining_event_loops():
    """Event loops created meanwhile (by orbax's restores) finish their tasks before closing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the policy API is deprecated from Python 3.14
        policy_class = getattr(asyncio, "DefaultEventLoopPolicy", None)
        if policy_class is not None:
            previous = asyncio.get_event_loop_policy()
            policy = policy_class()
            policy._loop_factory = _DrainingEventLoop  # what its new_event_loop() makes
            asyncio.set_event_loop_policy(policy)
    try:
        yield
    finally:
        if policy_class is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                asyncio.set_event_loop_policy(previous)
