"""Where a resumed run ends: at the step of the checkpoint it resumed from, when its length or
time budget (as given now) leaves no step to train; whether that checkpoint was saved before the
end its run was heading for, so a setting shortened it; and whether that step's end-of-run work
(its evaluation and BLEU, the checkpoint made the run's last) is still to do (shortened_end.py).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from jaxformer.training.schedule_end import ScheduleEnd

logger = logging.getLogger(__name__)


def heading_past(saved) -> bool:
    """Whether the run that saved a checkpoint (`saved`: its CheckpointMetadata) was heading past
    its step: not saved as its run's last (`saved_as_last`), its training.num_train_steps lay
    beyond, and its time budget, if any, was not spent there (a run its own budget ended there,
    found at its next check, was not: ending there shortens nothing)."""
    if saved.saved_as_last:
        return False
    training = saved.config["training"]
    minutes = training.get("time_budget_minutes") or 0.0
    spent = minutes > 0 and (saved.train_seconds or 0.0) >= minutes * 60
    return saved.step < training["num_train_steps"] and not spent


def saved_unfinished(saved) -> bool:
    """Whether a checkpoint (`saved`: its metadata) was saved before its step's end-of-run work
    (its evaluation and BLEU, the checkpoint as its run's last), which a run ending at that step
    does there: as its `saved_as_last` mark says. One from before the mark was, inferred, where
    its run was heading past it or it is interim (a signal that came once the budget ran out,
    before the next check, budget_check.BUDGET_CHECK_STEPS, stopped the run at its end with that work
    still to do); not told apart there, a scheduled checkpoint saved once the budget had run out,
    before the check, by a run then killed is taken as its run's end, its step's work undone."""
    if saved.saved_as_last is not None:
        return not saved.saved_as_last
    return saved.interim or heading_past(saved)


def shortened_past(training, step: int, heading: bool, budget_spent: bool, schedule_end: ScheduleEnd, state, rate):
    """For a run resumed at `step`: the setting that ends it there, before the end that the run
    which saved the step was heading for (`heading`, `heading_past`), said in one line with the
    rate the budget schedule ended at (`rate(count, opt_state)`): "training.num_train_steps=20";
    None when the run goes on, or had simply ended there (its time budget spent, if between two
    checks, a signal stopped it before it knew: it ends there as it would have), or had ended
    there before: a finished run, shortened or not, run again is finished, whatever its length."""
    if not heading:
        return None
    if step > training.num_train_steps:
        setting, shortened = f"training.num_train_steps={training.num_train_steps}", "past"
    elif step == training.num_train_steps:
        setting, shortened = f"training.num_train_steps={training.num_train_steps}", "to"
    elif budget_spent:  # a budget set, or lowered, below the seconds spent
        setting, shortened = f"training.time_budget_minutes={training.time_budget_minutes:g}", "past"
    else:
        return None
    said = f"{setting} ends the run at step {step}, already trained: it was shortened {shortened} that step"
    if not schedule_end.active:
        logger.warning("%s", said)
        return setting
    last, floor = (float(rate(np.int32(count), state.opt_state)) for count in (step - 1, 2**30))
    if last <= floor * (1 + 1e-4):
        logger.info("%s; the budget schedule had reached its floor", said)
    else:
        above = f"{last / floor:.1f}x its floor {floor:.3g}" if floor > 0 else "above its floor 0"
        logger.warning(
            "%s, so the budget schedule ended above its floor: the rate %.3g is %s (its end was step %.0f)",
            *(said, last, above, schedule_end.steps(state)),
        )
    return setting


class ResumedEnd(NamedTuple):
    """How a resumed run ends at the step it resumed at (neither: it goes on, or ended there before)."""

    shortened: str | None  # the setting that ends the run before the end it was heading for (shortened_past)
    unfinished: bool  # it ends at a checkpoint not saved as its run's last: that step's work is to do


def resumed_end(training, saved, step: int, budget_spent: bool, schedule_end: ScheduleEnd, state, rate) -> ResumedEnd:
    """How a run resumed at `step` from a checkpoint (`saved`: its metadata; None: a new run) ends
    there, with its `training` config and `budget_spent` (its time budget, if any, spent at the
    start); `schedule_end`, `state` and `rate` say the rate it ends at (shortened_past)."""
    if saved is None:
        return ResumedEnd(None, False)
    heading = heading_past(saved)  # saved before the end its run was heading for
    shortened = shortened_past(training, step, heading, budget_spent, schedule_end, state, rate)
    ends_here = step >= training.num_train_steps or budget_spent
    return ResumedEnd(shortened, ends_here and saved_unfinished(saved))
