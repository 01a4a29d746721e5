"""The "budget" learning-rate schedule's end (optimizer.py: `end_step`, in optimizer updates)
in the train state: set from training.num_train_steps at the start, kept or moved on resume
(saved_end_stands), and moved to each time budget check's estimate (budget_check.py), with a warning
where it falls within the warmup."""

from __future__ import annotations

import logging

import jax
import ml_collections
import numpy as np

from jaxformer.training.optimizer import end_step, set_end_step

logger = logging.getLogger(__name__)


class ScheduleEnd:
    """Sets the "budget" schedule's end (optimizer.py: `end_step`, in optimizer updates: train
    steps) in the train state; does nothing under other schedules."""

    def __init__(self, config: ml_collections.ConfigDict, state, replicated):
        self.max_steps = config.training.num_train_steps
        self.budget_minutes = config.training.time_budget_minutes or 0.0
        self.warmup_steps = config.optimizer.warmup_steps
        self.replicated = replicated
        self.active = end_step(state.opt_state) is not None
        self.warned_within_warmup = False
        self.end = self.steps(state) if self.active else None  # the end the next step's rate reads

    def steps(self, state) -> float:
        return float(jax.device_get(end_step(state.opt_state)))

    def set(self, state, steps: float, step: int | None = None, ends_by: str = "the time budget", said=False):
        """The schedule's end moved to `steps` (where `ends_by` ends the run); at train step `step`
        (a time budget's estimate), an end within the warmup is said once the pace is known over a
        quarter of the warmup (the first estimates, compilation included, run low). `said`: the
        caller's warning said it."""
        settled = step is None or 4 * step >= self.warmup_steps
        self.warned_within_warmup |= said
        if steps <= self.warmup_steps and settled and not self.warned_within_warmup:
            self.warned_within_warmup = True
            logger.warning(
                "budget schedule: %s ends the run near step %.0f, within optimizer.warmup_steps=%d: "
                "the rate will still be rising when it ends; a shorter warmup (or a longer run) lets it decay",
                ends_by,
                steps,
                self.warmup_steps,
            )
        self.end = float(np.float32(steps))
        value = jax.device_put(np.float32(steps), self.replicated)
        return state.replace(opt_state=set_end_step(state.opt_state, value))

    def reached_after(self, step: int) -> bool:
        """Whether the step after `step` would train at or past the schedule's end: at the floor."""
        return self.end is not None and step + 1 >= self.end

    def at_start(self, state, step: int, saved_training: dict | None, timed: bool):
        """Without a time budget the schedule ends at num_train_steps; with one, a new run starts
        from that guess and a resumed one (`saved_training`: the training config its checkpoint was
        saved with) keeps the estimate it saved, unless it no longer stands (saved_end_stands): then
        it starts from the same guess, until this segment's pace re-estimates it."""
        resumed = saved_training is not None
        if not self.active:
            return state
        # A run resumed at or past its length (finished, or shortened) trains no step: no end moves for it.
        trains = step < self.max_steps
        if resumed and timed:
            saved_end = self.steps(state)
            if saved_end_stands(saved_end, saved_training, self.max_steps, self.budget_minutes):
                logger.info("budget schedule: resumed with its end at step %.0f", saved_end)
                return state
            if trains:
                logger.info(
                    "budget schedule: its end moves from step %.0f, estimated for training.num_train_steps=%d and "
                    "training.time_budget_minutes=%g, to %d until this run's pace re-estimates it",
                    *(saved_end, saved_training["num_train_steps"], saved_training.get("time_budget_minutes") or 0.0),
                    self.max_steps,
                )
        elif resumed and trains and abs(self.steps(state) - self.max_steps) > 0.5:
            logger.info("budget schedule: its end moves from step %.0f to %d", self.steps(state), self.max_steps)
        return self.set(state, self.max_steps, ends_by=f"training.num_train_steps={self.max_steps}")


def saved_end_stands(saved_end: float, saved_training: dict, max_steps: int, budget_minutes: float) -> bool:
    """Whether a time-budgeted run resumed with training.num_train_steps=`max_steps` and a budget of
    `budget_minutes` keeps the schedule's end its checkpoint saved (`saved_end`, estimated under
    `saved_training`). Not where the run may now train past it: its length raised past an end that
    the old length capped (the budget's own estimate lay at or beyond it), or its budget raised;
    kept, the steps past it trained at the floor (0 by default) until the first check of the pace
    moved it. Nor where it lies past the length now. An unchanged run keeps it: resuming is exact."""
    if saved_end > max_steps:
        return False
    old_steps = saved_training["num_train_steps"]
    if saved_end >= old_steps and max_steps > old_steps:
        return False
    return budget_minutes <= (saved_training.get("time_budget_minutes") or 0.0)
