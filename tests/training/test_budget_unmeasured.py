"""A time budget spent before any step's duration could be measured (smaller than the first step's
compilation, e.g. training.time_budget_minutes=0.01): the run ends at the check that finds it
spent, or at the step whose evaluation does, with one warning naming the budget and the seconds
spent by the first step, and the budget schedule's end set there, as any spent budget's. A fake
clock, as in test_budget_schedule_end.py."""

import logging
import types

import jax
import jax.numpy as jnp
import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.budget_check import HeldRecord, check_budget, spent_by_work
from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.schedule_end import ScheduleEnd
from jaxformer.training.state import TrainState

COMPILED = 4.3  # the first step's seconds: its compilation
BUDGET_MINUTES = 0.01  # 0.6 s


def first_step_done(monkeypatch, schedule, log_every_steps):
    """(the fake clock's seconds, the budget, its ScheduleEnd, the train state, the training config,
    a writer and what it is given) once the first step, compiled, has spent the budget."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    config = default_config()
    config.optimizer.update(schedule=schedule, warmup_steps=100, learning_rate_scale=1.0)
    config.training.update(num_train_steps=1000, log_every_steps=log_every_steps)
    optimizer, _ = make_optimizer(config.optimizer, 32)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    state = schedule_end.at_start(state, 0, None, timed=True)
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(BUDGET_MINUTES * 60, clock)
    now[0] = COMPILED
    budget.step_done(1)
    written = []
    writer = types.SimpleNamespace(write=lambda step, values, prefix: written.append((step, values)))
    return now, budget, schedule_end, state, config.training, writer, written


def unmeasured(ends_at, rising):
    """The warning, as a user reads it."""
    within = ", within optimizer.warmup_steps=100: the budget schedule's rate was still rising" if rising else ""
    return (
        f"time budget: training.time_budget_minutes={BUDGET_MINUTES:g} (0.6 s) was spent before any step's duration "
        f"could be measured: {COMPILED} s by the end of step 1, its compilation included; the run ends at step "
        f"{ends_at}{within}; a budget longer than that lets it train"
    )


@pytest.mark.parametrize("schedule", ["budget", "rsqrt"])
def test_a_budget_spent_by_the_first_step_says_so_once_and_ends_the_schedule_there(monkeypatch, caplog, schedule):
    """The tiny config checks at every step: the check at step 1, which has no pace, finds it spent."""
    _, budget, schedule_end, state, training, writer, written = first_step_done(monkeypatch, schedule, 1)
    with caplog.at_level(logging.WARNING):
        reading, state = check_budget(budget, schedule_end, state, 1, writer, training)
    assert reading.spent and reading.seconds == COMPILED and reading.end_step == 2  # as any spent budget's
    assert written == [(1, {"seconds": COMPILED, "end_step": 2.0})]
    assert caplog.messages == [unmeasured(1, rising=schedule == "budget")]
    if schedule == "budget":
        assert schedule_end.steps(state) == 2  # not num_train_steps, as if the run went on


def test_a_budget_spent_by_the_first_step_and_found_at_a_later_check_names_both_steps(monkeypatch, caplog):
    """With log_every_steps of 10 or more the budget is checked every 10 steps: the run ends at
    step 10, its end within the warmup said in the same warning, not in a second."""
    now, budget, schedule_end, state, training, writer, _ = first_step_done(monkeypatch, "budget", 100)
    now[0] += 9 * 0.5  # steps 2-10: a pace, measured after the budget was spent
    with caplog.at_level(logging.WARNING):
        reading, state = check_budget(budget, schedule_end, state, 10, writer, training)
    assert reading.spent and reading.end_step == schedule_end.steps(state) == 11
    assert caplog.messages == [unmeasured(10, rising=True)]


def test_a_budget_spent_by_the_first_step_and_found_after_an_evaluation_says_so(monkeypatch, caplog):
    now, budget, schedule_end, state, _, writer, written = first_step_done(monkeypatch, "budget", 100)
    now[0] += 4 * 0.5 + 3.0  # steps 2-5, then step 5's evaluation
    with caplog.at_level(logging.WARNING):
        spent, state = spent_by_work(budget, schedule_end, state, 5, HeldRecord(writer))
    assert spent and schedule_end.steps(state) == 6
    assert written == []  # no check's record held at step 5 (not a logged step): none made up
    assert caplog.messages == [unmeasured(5, rising=True)]


def test_a_budget_the_first_step_left_time_in_is_spent_as_before(monkeypatch, caplog):
    """Spent at step 2, the pace measured: no such warning (a normal end within the warmup is
    test_budget_schedule_end.py's)."""
    now, budget, schedule_end, state, training, writer, _ = first_step_done(monkeypatch, "rsqrt", 1)
    budget.seconds = COMPILED + 0.4
    now[0] += 0.5
    with caplog.at_level(logging.WARNING):
        reading, _ = check_budget(budget, schedule_end, state, 2, writer, training)
    assert reading.spent and reading.end_step == 3 and not caplog.messages
