"""How far the training loop runs ahead of the device. JAX dispatches a step and returns at
once, so the loop's Python would otherwise run up to the next read of a value (the log, every
training.log_every_steps) ahead of the computation: a SIGTERM, handled once the main thread is back
in Python, then stopped the run up to that many steps after the one computing, and the time
budget read the pace of steps dispatched, not done."""

from __future__ import annotations

from typing import Any

import jax


class StepsAhead:
    """Call `dispatched(outputs)` after each step is dispatched: it waits for the step before,
    so the loop is at most one step ahead of the one computing. The step just dispatched is
    already queued, so the device never waits on the loop."""

    def __init__(self):
        self._previous: Any = None  # the last step's outputs, waited for once the next is dispatched

    def dispatched(self, outputs: Any) -> None:
        """`outputs`: something small the step computes (its metrics, not the donated state)."""
        if self._previous is not None:
            jax.block_until_ready(self._previous)
        self._previous = outputs
