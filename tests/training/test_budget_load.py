"""The budget schedule under a load that comes and goes: the pace is averaged since the segment's
first step (TimeBudget.seconds_per_step), so a stall or a slow stretch lowers the end's estimate
for the rest of the segment, and the checks move it up again as the budget runs down. Whatever the
load, the rate reaches its floor where the budget is spent, and the rate's sum over the steps stays
within 15% of what a schedule knowing the load in advance would spend. A fake clock; the rates from
optimizer.budget_rate, as a run's checks of every BUDGET_CHECK_STEPS steps set the end."""

import types

import numpy as np
import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.budget_check import BUDGET_CHECK_STEPS, budget_check_due
from jaxformer.training.optimizer import budget_rate

BUDGET_SECONDS, WARMUP, MAX_STEPS = 1800.0, 200, 16000


def budgeted_run(monkeypatch, step_seconds, seconds=BUDGET_SECONDS, warmup=WARMUP) -> tuple[np.ndarray, np.ndarray]:
    """(each update's rate over the peak, the estimate of the end after each check) of a run whose
    step at clock second t takes step_seconds(t), until its budget of `seconds` is spent."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(seconds, clock)
    end, step, ends_used, estimates = float(MAX_STEPS), 0, [], []
    while not budget.spent():
        ends_used.append(end)  # the end this update's rate reads: set by the last check before it
        now[0] += step_seconds(now[0])
        step += 1
        budget.step_done(step)
        if step % BUDGET_CHECK_STEPS == 0 and (estimate := budget.end_step(step, MAX_STEPS)) is not None:
            end = estimate
            estimates.append(estimate)
    rates = budget_rate(np.arange(step), np.asarray(ends_used, np.float32), 1.0, warmup, 0.0)
    return np.asarray(rates), np.asarray(estimates)


LOADS = {
    "steady": lambda t: 1.0,
    "a 300 s stall after 5 minutes": lambda t: 301.0 if 300 <= t < 301 else 1.0,
    "half speed for the first 10 minutes": lambda t: 2.0 if t < 600 else 1.0,
    "half speed for the last 10 minutes": lambda t: 2.0 if t >= 1200 else 1.0,
    "half speed in the middle 10 minutes": lambda t: 2.0 if 600 <= t < 1200 else 1.0,
}


@pytest.mark.parametrize("load", LOADS)
def test_the_rate_reaches_its_floor_where_the_budget_is_spent_whatever_the_load(monkeypatch, load):
    rates, _ = budgeted_run(monkeypatch, LOADS[load])
    assert rates[-1] < 0.01  # the last update's rate: at the floor (0) within 1% of the peak
    # A schedule that knew the load would warm up, then decay linearly to 0 at the last step. The
    # pace since the start misses it by 10% (a slow first third: the end estimated low until late)
    # and 11% (a slow last third, followed as the budget runs down: the decay steepens at the end); steady, by nothing.
    known = budget_rate(np.arange(len(rates)), len(rates), 1.0, WARMUP, 0.0)
    assert rates.sum() == pytest.approx(float(np.sum(known)), rel=0.15)


def test_a_stall_lowers_the_estimate_and_the_checks_raise_it_again(monkeypatch):
    """After a 300 s stall at 1 s a step, 1,500 steps fit in the 1,800 s: the estimates made just
    after the stall put the end below that, and later ones climb back to it, never above."""
    rates, estimates = budgeted_run(monkeypatch, LOADS["a 300 s stall after 5 minutes"])
    steps = len(rates)
    assert steps == pytest.approx(1500, abs=2)
    after_stall = estimates[30]  # the check at step 310, the first after it
    assert after_stall < 0.8 * steps
    assert np.all(np.diff(estimates[30:]) > -1.0) and estimates[-1] == pytest.approx(steps, abs=BUDGET_CHECK_STEPS)


def test_a_short_budget_slowed_near_its_end_still_ends_at_its_floor(monkeypatch):
    """A 30-second budget at 0.02 s a step (the first, its compilation, 4 s), ten times slower for
    its last 5 s (another process's load, as on a shared machine): the pace since the start, still
    near 0.02 s, put the end about 50 steps past where the budget ran out, and the rate ended at 4.9% of
    the peak (on the tiny config, slowed by a test run beside it, 10.3%). The pace is the slower of
    that and the pace over the last seconds as many as are left: the last step's rate is within a
    check's steps of the floor, and it never rises past the peak."""
    slowed = lambda t: 4.0 if t == 0 else 0.02 if t < 25 else 0.2  # noqa: E731
    rates, _ = budgeted_run(monkeypatch, slowed, seconds=30.0, warmup=50)
    assert rates[-1] < BUDGET_CHECK_STEPS / (len(rates) - 50) and rates.max() <= 1.0 + 1e-6


def stalled_run(monkeypatch, stall_at: int | None, stall: float) -> tuple[int, int | None, np.ndarray, list[float]]:
    """(the last step, the step the budget ran out during, each update's rate over the peak, the
    end each read) of a 30 s budget at 0.02 s a step (the first, compiled, 4 s), checked where
    budget_check_due says, with a stall of `stall` seconds during step `stall_at`."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(30.0, clock)
    schedule_end = types.SimpleNamespace(end=float(MAX_STEPS))
    schedule_end.reached_after = lambda step: step + 1 >= schedule_end.end
    step, ends, ran_out = 0, [], None
    while True:
        ends.append(schedule_end.end)
        now[0] += 4.0 if step == 0 else 0.02 + (stall if step + 1 == stall_at else 0.0)
        step += 1
        budget.step_done(step)
        ran_out = ran_out or (step if budget.spent() else None)
        if budget_check_due(step, 10, schedule_end):
            estimate = budget.end_step(step, MAX_STEPS)
            if budget.spent():
                break
            if estimate is not None:
                schedule_end.end = float(np.float32(estimate))
    return step, ran_out, np.asarray(budget_rate(np.arange(step), np.asarray(ends, np.float32), 1.0, 50, 0.0)), ends


@pytest.mark.parametrize("before_the_end", [3, 6, 9, 12])
@pytest.mark.parametrize("stall", [0.3, 1.0])
def test_a_stall_in_the_last_checks_steps_ends_within_their_steps_of_the_floor(monkeypatch, before_the_end, stall):
    """The bound budget_check_due documents: the budget spent by a stall between two checks is found
    at the next, up to 9 steps later, the rate decaying meanwhile toward the end estimated before
    it; the last rate is at most that of the step the budget ran out during, its steps to that end
    over the decay's (0.08-0.88% of the peak here)."""
    steady, _, rates, _ = stalled_run(monkeypatch, None, 0.0)
    assert rates[-1] == 0.0  # steady: the budget ends at the floor
    last, ran_out, rates, ends = stalled_run(monkeypatch, steady - before_the_end, stall)
    assert ran_out == steady - before_the_end and last - ran_out < BUDGET_CHECK_STEPS
    end = ends[ran_out - 1]
    assert rates[-1] <= rates[ran_out - 1] <= (end - ran_out + 1) / (end - 50) < 0.01
