"""When R-Drop starts (training.rdrop_start): the first part of a run trains without it.

An R-Drop step (training.rdrop_alpha, step.py) runs the batch twice. It costs about two plain
steps and, early in a run, learns less per second than they do. On a fast 2-core hour the plain
steps had validation NLL 1.75 at 17 minutes, where the R-Drop steps had 1.92. R-Drop overtook
the plain run only after 35 minutes, when the plain run had stopped improving (README: Results; docs/multi30k_runs.md).
So a run can train plain until it is `rdrop_start` of the way through, then switch to R-Drop.
Measured on that fast hour, 0.4 led at equal time until about 45 minutes, then ended behind R-Drop
from the first step (README: Results; docs/multi30k_runs.md), so `multi30k` keeps 0; a machine that buys far fewer steps
in the hour is where a later start may pay.

The run's progress is the larger of two fractions: the time budget spent
(training.time_budget_minutes) and the steps done out of training.num_train_steps. The run ends
when its progress reaches 1. R-Drop starts at the first step taken at progress >= rdrop_start,
and stays on. Resumed, the run finds its phase from the checkpoint's step and training seconds.

The time it is checked at is the reading that every process takes from process 0
(budget.check_budget), so all processes switch at the same step.
"""

from __future__ import annotations

import dataclasses

import ml_collections

# What a step costs once R-Drop runs, over a plain step, until it is measured. The batch runs
# twice through the same program, so the cost doubles (1.9x measured on 2 CPU cores). The budget
# schedule's end is estimated with this factor until R-Drop starts, and from its measured pace after.
RDROP_STEP_COST = 2.0


@dataclasses.dataclass(frozen=True)
class RDropStart:
    """R-Drop starts at step `step` or at `seconds` of training, whichever comes first (None: no time budget)."""

    step: float
    seconds: float | None

    @classmethod
    def from_config(cls, training: ml_collections.ConfigDict) -> RDropStart | None:
        """None when every step is the same: no R-Drop, or R-Drop from the first step."""
        if not (training.rdrop_alpha > 0 and training.rdrop_start > 0):
            return None
        budget_seconds = training.time_budget_minutes * 60
        return cls(
            step=training.rdrop_start * training.num_train_steps,
            seconds=training.rdrop_start * budget_seconds if budget_seconds else None,
        )

    def started(self, step: int, seconds: float) -> bool:
        """Whether the step after `step` completed ones, taken at `seconds` of training, uses R-Drop."""
        return step >= self.step or (self.seconds is not None and seconds >= self.seconds)

    def plain_seconds_left(self, step: int, seconds: float, seconds_per_step: float) -> float:
        """The training seconds until R-Drop starts, at `seconds_per_step` for the plain steps."""
        by_steps = max(self.step - step, 0.0) * seconds_per_step
        by_time = float("inf") if self.seconds is None else max(self.seconds - seconds, 0.0)
        return min(by_steps, by_time)
