"""The training loop's checks of its time budget (budget.py's `TimeBudget`), and what they decide.

`budget_check_due` says after which steps the budget is read; `check_budget` reads it there, and
`spent_by_work` after a step's evaluation and BLEU, both taking process 0's reading in every
process, so that all stop (and start R-Drop) at the same step with the same schedule: a spent
budget ends the run at that step, and otherwise the schedule's end (schedule_end.py) moves to the
step the pace so far gives. `HeldRecord` holds a step's budget/ record until that step's work may
no longer change it.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.training.budget import TimeBudget
from jaxformer.training.schedule_end import ScheduleEnd

logger = logging.getLogger(__name__)

BUDGET_CHECK_STEPS = 10  # a time budget is checked (and the schedule's end re-estimated) this often at most


def budget_check_due(step: int, log_every_steps: int, schedule_end: ScheduleEnd) -> bool:
    """Whether the time budget is checked after `step`: every BUDGET_CHECK_STEPS steps (every
    `log_every_steps` where fewer), and wherever the next step would train at or past the budget
    schedule's end. Checked every 10 steps alone, an end estimated between two checks left up to 9
    steps to train past it at the floor (rate 0 by default) until the next found the budget spent;
    checked there, the budget spent ends the run, or the end moves on with the pace.

    A stall between two checks (the machine paused, another job) that spends the budget is found at
    the next: up to 9 steps train past the budget, decaying toward the end estimated before it, so
    the last rate is at most that of the step the budget ran out during, above the floor by its
    steps to that end over the decay's (within the last check's steps, under 10 of them). On a fake
    clock (test_budget_load.py: 30 s at 0.02 s a step, 1,302 steps), a 0.3-1 s stall in the last 12
    steps ended at 0.08-0.88% of the peak, 1-7 steps past the budget. Checking wherever the budget
    left is shorter than the steps to the end at the pace would read each process's own clock at
    every step, and the check is a collective (processes that disagree hang); it ends the run at
    the stall's step, no nearer the floor where the stall spends all that is left (0.16-1.1%), and
    helped only where it spends part (0.3 s 20 steps before the end: 0.88% to 0). Not done."""
    return step % min(log_every_steps, BUDGET_CHECK_STEPS) == 0 or schedule_end.reached_after(step)


class BudgetReading(NamedTuple):
    """One check of the time budget, the same in every process (process 0's)."""

    spent: bool  # the budget is spent: this step is the run's last
    seconds: float  # the training seconds read
    end_step: float | None  # where the budget runs out at the pace so far (None: no pace yet)


class HeldRecord:
    """A writer for check_budget that holds the step's budget/ record until the step's work is
    done (`write_held`: before its checkpoint, else after the work): an evaluation or BLEU that then
    spends the budget ends the schedule at the next step (spent_by_work), and the record says so.
    Written at the check, it said the estimate the work overtook, and a second record of the step
    would break metrics.jsonl's one record of each step's metrics (metrics.py)."""

    def __init__(self, writer):
        self.writer = writer
        self._held: tuple[int, dict[str, float], str] | None = None  # (step, values, prefix)

    def write(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        self.write_held()
        self._held = (step, dict(values), prefix)

    def spent_at(self, step: int, seconds: float) -> None:
        """The budget was spent by `step`'s work at `seconds`: the schedule ends at the next step."""
        self.estimated_at(step, seconds, step + 1.0)

    def estimated_at(self, step: int, seconds: float, end: float) -> None:
        """After `step`'s work, at `seconds`, the schedule's end was set to `end`."""
        if self._held is not None and self._held[0] == step:
            self._held[1].update(seconds=seconds, end_step=end)

    def write_held(self) -> None:
        if self._held is not None:
            step, values, prefix = self._held
            self._held = None
            self.writer.write(step, values, prefix=prefix)


def _reading(values: list[float]) -> list[float]:
    """Process 0's `values`, in every process."""
    reading = np.asarray(values, np.float64)
    if jax.process_count() > 1:
        reading = np.asarray(multihost_utils.broadcast_one_to_all(reading))
    return [float(value) for value in reading]


def _unmeasured(budget: TimeBudget) -> list[float]:
    """`budget.spent_unmeasured()` as a reading's two last values (-1 for None)."""
    first = budget.spent_unmeasured()
    return [-1.0, -1.0] if first is None else [float(first[0]), first[1]]


def _warn_spent_unmeasured(budget: TimeBudget, schedule_end: ScheduleEnd, step: int, first: list[float]) -> bool:
    """Says that the budget, spent at `step`, was spent before any step's duration was measured
    (`first`: the segment's first step and the seconds then, from `_unmeasured`), where it was;
    whether it said so. The schedule ends at the next step, as any spent budget's. A resumed
    segment's earlier ones had measured theirs: what spent the budget is said, the seconds they
    left and this segment's first step, its compilation again (a longer budget is no advice there:
    the same budget resumed from an earlier checkpoint trains on)."""
    if first[0] < 0:
        return False
    rising = schedule_end.active and step + 1 <= schedule_end.warmup_steps
    before = budget.clock.seconds_before
    if before > 0:
        spent_by = (
            f"this segment's steps could be measured: {before:.1f} s by the run up to step {first[0] - 1:.0f}, "
            f"where it resumed with {budget.seconds - before:.1f} s left, then {first[1] - before:.1f} s by the end "
            f"of step {first[0]:.0f}, its compilation again included ({first[1]:.1f} s in all)"
        )
        advice = "a resume from a checkpoint with more of the budget left than its compilation takes trains on"
    else:
        spent_by = (
            f"any step's duration could be measured: {first[1]:.1f} s by the end of step {first[0]:.0f}, "
            "its compilation included"
        )
        advice = "a budget longer than that lets it train"
    logger.warning(
        "time budget: training.time_budget_minutes=%g (%.1f s) was spent before %s; the run ends at step %d%s; %s",
        budget.seconds / 60,
        budget.seconds,
        spent_by,
        step,
        f", within optimizer.warmup_steps={schedule_end.warmup_steps}: the budget schedule's rate was still rising"
        if rising
        else "",
        advice,
    )
    return True


def _set_estimate(schedule_end: ScheduleEnd, state, estimate: float, step: int, spent: bool, said: bool):
    """The state with the schedule's end set to a reading's `estimate` at `step`."""
    capped = estimate >= schedule_end.max_steps  # the estimate stops at the run's own end
    ends_by = f"training.num_train_steps={schedule_end.max_steps}" if capped else "the time budget"
    # Spent, the end is this step's, not an early estimate: one within the warmup is said however early.
    return schedule_end.set(state, estimate, None if spent else step, ends_by, said)


def check_budget(budget: TimeBudget, schedule_end: ScheduleEnd, state, step: int, writer, training):
    """(the budget's reading, the state with the schedule's end re-estimated). Every process takes
    process 0's reading, so all stop (and start R-Drop) at the same step with the same schedule."""
    estimate = budget.end_step(step, training.num_train_steps)
    spent, estimate, seconds, *first = _reading(
        [budget.spent(), -1.0 if estimate is None else estimate, budget.clock.seconds(), *_unmeasured(budget)]
    )
    spent = bool(spent)
    if spent and estimate < 0:  # spent at the step the pace is measured from: it ends there too
        estimate = step + 1.0
    said = spent and _warn_spent_unmeasured(budget, schedule_end, step, first)
    if estimate > 0 and schedule_end.active:
        state = _set_estimate(schedule_end, state, estimate, step, spent, said)
    if step % training.log_every_steps == 0 or spent:  # spent between log steps (budget_check_due): the run's last
        # No end_step until a pace gives one: left out, not NaN (written "nan", as a figure measured so would be).
        estimated = {"end_step": estimate} if estimate > 0 else {}
        writer.write(step, {"seconds": seconds, **estimated}, prefix="budget/")
    return BudgetReading(spent, seconds, estimate if estimate > 0 else None), state


def spent_by_work(budget: TimeBudget, schedule_end: ScheduleEnd, state, step: int, record: HeldRecord):
    """(whether this step's evaluation and BLEU, done, have spent the budget, the state): process
    0's reading, the same in every process. Spent, the step is the run's last, and the schedule's
    end is set there as a check's would be, before the step's checkpoint saves it; the step's
    budget/ record held in `record`, if any, says that end and the seconds then. Not spent, the end
    is estimated again with the work's seconds, and the record says that one: the check before it
    foresaw a kind's first in the segment (its compilation) as free, and the steps up to the next
    check read its estimate, the budget spent before it with the rate above its floor (the tiny
    config, a 0.5-minute budget on a loaded machine, evaluating every 500 steps: the first, at step
    500, left the end at 537, and the run ended at step 510 at 5.6% of the peak)."""
    estimate = budget.end_step(step, schedule_end.max_steps, work_done=True) if schedule_end.active else None
    spent, seconds, estimate, *first = _reading(
        [budget.spent(), budget.clock.seconds(), -1.0 if estimate is None else estimate, *_unmeasured(budget)]
    )
    spent = bool(spent)
    said = spent and _warn_spent_unmeasured(budget, schedule_end, step, first)
    if spent:
        record.spent_at(step, seconds)
    if spent and schedule_end.active:
        state = schedule_end.set(state, step + 1.0, said=said)
    elif estimate > 0:
        record.estimated_at(step, seconds, estimate)
        state = _set_estimate(schedule_end, state, estimate, step, spent=False, said=False)
    return spent, state
