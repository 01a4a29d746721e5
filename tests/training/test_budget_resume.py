"""A time-budgeted run resumed with less of its budget left than its start takes (budget_resume.py):
its first step, compiling again, spends the budget. The end the checkpoint saved is moved to that
step, so it trains at the floor, and the warning says what spent the budget: the earlier segments'
seconds and this one's compilation, not that a longer budget lets it train. A fake clock, as in
test_budget_unmeasured.py; the numbers are the tiny config's, killed with kill -9 as its 0.5-minute
budget ran out and run again from checkpoint 1000."""

import logging
import types

import jax
import jax.numpy as jnp
import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import FIRST_STEP, TimeBudget, TrainingClock
from jaxformer.training.budget_check import budget_check_due, check_budget
from jaxformer.training.budget_resume import end_at_resume
from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.schedule_end import ScheduleEnd
from jaxformer.training.state import TrainState

SAVED_SECONDS, SAVED_END, RESUMED_AT = 27.8, 1093.4, 1000  # the checkpoint's train_seconds, schedule end, step
LAST_START = 4.3  # the first step of the run's last start, its compilation included
COMPILED = 4.7  # this segment's first step


def resumed(monkeypatch, first_step_seconds=LAST_START):
    """(the fake clock, the budget, its ScheduleEnd, the state as the loop has it before its first
    step, the learning rate, the training config) of the run resumed at RESUMED_AT."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=100, learning_rate_scale=1.0, decay_floor=0.0)
    config.training.update(num_train_steps=100000, log_every_steps=10, time_budget_minutes=0.5)
    optimizer, learning_rate = make_optimizer(config.optimizer, 32)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    state = schedule_end.set(state, SAVED_END)  # as the checkpoint saved it
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    state = schedule_end.at_start(state, RESUMED_AT, config.training.to_dict(), timed=True)
    assert schedule_end.steps(state) == pytest.approx(SAVED_END, abs=1e-3)  # the saved end stands
    clock = TrainingClock(SAVED_SECONDS)
    saved = {"evaluate": 0.3} if first_step_seconds is None else {"evaluate": 0.3, FIRST_STEP: first_step_seconds}
    budget = TimeBudget(30.0, clock, work_every={"evaluate": 100}, work_seconds=saved)
    state = end_at_resume(budget, schedule_end, state, RESUMED_AT)
    clock.start()
    return now, budget, schedule_end, state, learning_rate, config.training


def test_a_resume_left_less_than_its_start_takes_trains_its_one_step_at_the_floor(monkeypatch, caplog):
    now, budget, schedule_end, state, learning_rate, training = resumed(monkeypatch)
    assert schedule_end.steps(state) == RESUMED_AT + 1
    first_rate = float(learning_rate(jnp.int32(RESUMED_AT), state.opt_state))  # step 1001's: count 1000
    assert first_rate == 0.0  # the floor; 9.3% of the peak with the saved end, 1093.4, kept
    now[0] = COMPILED
    budget.step_done(RESUMED_AT + 1)
    assert budget_check_due(RESUMED_AT + 1, training.log_every_steps, schedule_end)  # not at step 1010
    writer = types.SimpleNamespace(write=lambda *args, **kwargs: None)
    with caplog.at_level(logging.WARNING):
        reading, state = check_budget(budget, schedule_end, state, RESUMED_AT + 1, writer, training)
    assert reading.spent
    assert caplog.messages == [
        "time budget: training.time_budget_minutes=0.5 (30.0 s) was spent before this segment's steps could be "
        "measured: 27.8 s by the run up to step 1000, where it resumed with 2.2 s left, then 4.7 s by the end of "
        "step 1001, its compilation again included (32.5 s in all); the run ends at step 1001; a resume from a "
        "checkpoint with more of the budget left than its compilation takes trains on"
    ]
    assert budget.saved_work_seconds() == {"evaluate": 0.3, FIRST_STEP: pytest.approx(COMPILED)}  # the latest start's


@pytest.mark.parametrize("first_step_seconds", [1.0, None])
def test_a_resume_left_more_than_its_start_took_keeps_its_saved_end(monkeypatch, first_step_seconds):
    """Its checks re-estimate the end from this segment's pace; with no first step's seconds in the
    checkpoint (saved before they were kept) nothing is foreseen."""
    _, _, schedule_end, state, _, _ = resumed(monkeypatch, first_step_seconds)
    assert schedule_end.steps(state) == pytest.approx(SAVED_END, abs=1e-3)


def test_the_first_steps_seconds_leave_out_the_work_before_it(monkeypatch):
    """A fine-tuning run's measurement of its start, at step 0, is work, not the start's cost."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(600.0, clock, work_every={"evaluate": 100})
    assert budget.saved_work_seconds() == {}
    now[0] = 3.0
    budget.work_done("evaluate", 3.0)
    now[0] = 7.0
    budget.step_done(1)
    now[0] = 9.0
    budget.step_done(2)
    assert budget.saved_work_seconds() == {FIRST_STEP: 4.0}


def test_a_start_quicker_than_the_last_moves_the_end_on_from_the_floor_once_a_pace_is_known(monkeypatch):
    """The first step left budget after it: its check, with no pace, keeps the end there; the next
    step's (due: it would train past the end) moves it on with the pace, for the steps still left."""
    now, budget, schedule_end, state, _, training = resumed(monkeypatch)
    writer = types.SimpleNamespace(write=lambda *args, **kwargs: None)
    now[0] = 1.0  # compiled in 1 s this time: 1.2 s left
    budget.step_done(RESUMED_AT + 1)
    reading, state = check_budget(budget, schedule_end, state, RESUMED_AT + 1, writer, training)
    assert not reading.spent and schedule_end.steps(state) == RESUMED_AT + 1
    now[0] += 0.02
    budget.step_done(RESUMED_AT + 2)
    assert budget_check_due(RESUMED_AT + 2, training.log_every_steps, schedule_end)
    reading, state = check_budget(budget, schedule_end, state, RESUMED_AT + 2, writer, training)
    assert not reading.spent and schedule_end.steps(state) == pytest.approx(RESUMED_AT + 2 + 1.18 / 0.02, abs=1)
