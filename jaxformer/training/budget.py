"""A run's training time and its wall-clock budget (training.time_budget_minutes).

`TrainingClock` counts the seconds the training loop has spent across resumes: what the run had
spent when the checkpoint it resumes from was saved (CheckpointMetadata.train_seconds), plus this
process's time since its loop started. `TimeBudget` turns the pace measured so far into the step
at which the budget runs out: the end of the "budget" learning-rate schedule (optimizer.py),
corrected as the run goes, and the signal to stop.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.training.optimizer import end_step, set_end_step
from jaxformer.training.rdrop_start import RDROP_STEP_COST, RDropStart

logger = logging.getLogger(__name__)


class TrainingClock:
    """Seconds spent by the run's training loop: `seconds_before` (earlier segments, up to the
    checkpoint this one resumed from) plus the time since `start()`."""

    def __init__(self, seconds_before: float = 0.0):
        self.seconds_before = seconds_before
        self._started: float | None = None

    def start(self) -> None:
        self._started = time.monotonic()

    def seconds(self) -> float:
        return self.seconds_before + (0.0 if self._started is None else time.monotonic() - self._started)


class TimeBudget:
    """A wall-clock budget of `seconds` for the training loop. The pace is measured from this
    segment's first completed step, so the first step's compilation is spent but not
    extrapolated; evaluations and checkpoints inside the measured span are, which is what
    the remaining steps will also pay.

    `rdrop_start`: R-Drop is still to start (rdrop_start.py). Its steps are counted at
    RDROP_STEP_COST times the plain pace until `rdrop_started()`, which measures the pace afresh."""

    def __init__(self, seconds: float, clock: TrainingClock, rdrop_start: RDropStart | None = None):
        self.seconds, self.clock, self.rdrop_start = seconds, clock, rdrop_start
        self._pace_from: tuple[int, float] | None = None  # (step, clock seconds) where the pace is measured from

    def step_done(self, step: int) -> None:
        if self._pace_from is None:
            self._pace_from = (step, self.clock.seconds())

    def rdrop_started(self) -> None:
        """The steps from now on are R-Drop steps: their pace is measured from the first one
        completed (its compilation spent, not extrapolated)."""
        self.rdrop_start, self._pace_from = None, None

    def spent(self) -> bool:
        return self.clock.seconds() >= self.seconds

    def seconds_per_step(self, step: int) -> float | None:
        if self._pace_from is None or step <= self._pace_from[0]:
            return None
        first_step, first_seconds = self._pace_from
        return (self.clock.seconds() - first_seconds) / (step - first_step)

    def end_step(self, step: int, max_steps: int) -> float | None:
        """The step at which the budget runs out at the pace so far, within [step + 1,
        max_steps]; None before a pace is known."""
        pace = self.seconds_per_step(step)
        if pace is None:
            return None
        pace, now = max(pace, 1e-9), self.clock.seconds()
        remaining = max(self.seconds - now, 0.0)
        steps_left = remaining / pace
        if self.rdrop_start is not None:
            plain = min(self.rdrop_start.plain_seconds_left(step, now, pace), remaining)
            steps_left = plain / pace + (remaining - plain) / (pace * RDROP_STEP_COST)
        return float(min(max(step + steps_left, step + 1), max_steps))


BUDGET_CHECK_STEPS = 10  # a time budget is checked (and the schedule's end re-estimated) this often at most


class ScheduleEnd:
    """Sets the "budget" schedule's end (optimizer.py: `end_step`, in optimizer updates: train
    steps) in the train state; does nothing under other schedules."""

    def __init__(self, config: ml_collections.ConfigDict, state, replicated):
        self.max_steps = config.training.num_train_steps
        self.warmup_steps = config.optimizer.warmup_steps
        self.replicated = replicated
        self.active = end_step(state.opt_state) is not None
        self.warned_within_warmup = False

    def steps(self, state) -> float:
        return float(jax.device_get(end_step(state.opt_state)))

    def set(self, state, steps: float, step: int | None = None, ends_by: str = "the time budget"):
        """The schedule's end moved to `steps` (where `ends_by` ends the run); at train step `step`
        (a time budget's estimate), an end within the warmup is said once the pace is known over a
        quarter of the warmup (the first estimates, compilation included, run low)."""
        settled = step is None or 4 * step >= self.warmup_steps
        if steps <= self.warmup_steps and settled and not self.warned_within_warmup:
            self.warned_within_warmup = True
            logger.warning(
                "budget schedule: %s ends the run near step %.0f, within optimizer.warmup_steps=%d: "
                "the rate will still be rising when it ends; a shorter warmup (or a longer run) lets it decay",
                ends_by,
                steps,
                self.warmup_steps,
            )
        value = jax.device_put(np.float32(steps), self.replicated)
        return state.replace(opt_state=set_end_step(state.opt_state, value))

    def at_start(self, state, step: int, resumed: bool, timed: bool):
        """Without a time budget the schedule ends at num_train_steps; with one, a new run starts
        from that guess and a resumed one keeps the estimate it saved."""
        if not self.active or (resumed and timed):
            if self.active:
                logger.info("budget schedule: resumed with its end at step %.0f", self.steps(state))
            return state
        if resumed and abs(self.steps(state) - self.max_steps) > 0.5:
            logger.info("budget schedule: its end moves from step %.0f to %d", self.steps(state), self.max_steps)
        return self.set(state, self.max_steps, ends_by=f"training.num_train_steps={self.max_steps}")


class BudgetReading(NamedTuple):
    """One check of the time budget, the same in every process (process 0's)."""

    spent: bool  # the budget is spent: this step is the run's last
    seconds: float  # the training seconds read
    end_step: float | None  # where the budget runs out at the pace so far (None: no pace yet)


def check_budget(budget: TimeBudget, schedule_end: ScheduleEnd, state, step: int, writer, training):
    """(the budget's reading, the state with the schedule's end re-estimated). Every process takes
    process 0's reading, so all stop (and start R-Drop) at the same step with the same schedule."""
    estimate = budget.end_step(step, training.num_train_steps)
    reading = np.asarray([budget.spent(), -1.0 if estimate is None else estimate, budget.clock.seconds()], np.float64)
    if jax.process_count() > 1:
        reading = np.asarray(multihost_utils.broadcast_one_to_all(reading))
    spent, estimate, seconds = bool(reading[0]), float(reading[1]), float(reading[2])
    if estimate > 0 and schedule_end.active:
        capped = estimate >= training.num_train_steps  # the estimate stops at the run's own end
        ends_by = f"training.num_train_steps={training.num_train_steps}" if capped else "the time budget"
        state = schedule_end.set(state, estimate, step, ends_by)
    if step % training.log_every_steps == 0:
        writer.write(step, {"seconds": seconds, "end_step": estimate if estimate > 0 else math.nan}, prefix="budget/")
    return BudgetReading(spent, seconds, estimate if estimate > 0 else None), state
