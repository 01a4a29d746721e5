"""The budget schedule's end where a time-budgeted run resumes with less of its budget left than
its start takes: the first step of a segment compiles the train step again, and the budget counts
that wall clock as any other (README "Training budget").

Kept, the saved end was estimated for a run that would not stop: a run killed with kill -9 as
its 0.5-minute budget ran out at step 651 on the tiny config resumed from checkpoint 600 with its
end at step 663, 28.07 s of the budget spent; its first step, compiling again, took 7 s, and the
budget, spent before any step's duration was measured, ended the run at the first check, step 610,
the rate at 8.6% of its peak (reproduced: resumed at step 1000, 27.8 s spent, its end at 1093, it
ended at step 1010 at 8.0%). Two ways out: end the run at once where it resumed, the rate where it
was (the checkpoint's, above the floor), or move the schedule's end so the step that spends the
budget trains at its floor. A user of a one-hour budget wants the final model trained to the floor
where it can be, so the end moves: where the budget left is no longer than the run's last start's
first step took (FIRST_STEP in the checkpoint's work_seconds, its compilation included), the end is
the resumed step's next. That step then trains at the floor, and the check it makes due
(budget_check_due: the next step would train at or past the end) finds the budget spent and ends
the run there. A start quicker than the last leaves some budget after that step: the check has
no pace yet, and the next step's check, with one, moves the end on from the floor (the rate rises
again, from the floor, for the few steps the budget then has left).

A budget left longer than the last start took keeps the saved end (exact resume), and this
segment's checks re-estimate it from its own pace, as any run's.
"""

from __future__ import annotations

import logging

from jaxformer.training.budget import TimeBudget
from jaxformer.training.schedule_end import ScheduleEnd

logger = logging.getLogger(__name__)


def end_at_resume(budget: TimeBudget | None, schedule_end: ScheduleEnd, state, step: int):
    """The state with the budget schedule's end moved to `step + 1` where a run resumed at `step`
    has no more of its budget left than its last start's first step took (`first_step_seconds`,
    carried in the checkpoint): that step, which spends the budget, trains at the floor. The same
    in every process: the seconds are the checkpoint's."""
    if budget is None or not schedule_end.active or budget.first_step_seconds is None:
        return state
    left = budget.seconds - budget.clock.seconds_before
    if left <= 0 or left > budget.first_step_seconds or step + 1 >= schedule_end.end:
        return state
    logger.info(
        "budget schedule: resumed with %.1f s of the time budget left, no more than the %.1f s its last start's "
        "first step took (compilation included): its end moves from step %.0f to %d, so the step that spends the "
        "budget trains at its floor",
        left,
        budget.first_step_seconds,
        schedule_end.end,
        step + 1,
    )
    return schedule_end.set(state, step + 1.0)
