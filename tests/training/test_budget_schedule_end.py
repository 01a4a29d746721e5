"""The time budget's estimate and the budget schedule's end, with a fake clock: the steps' pace
(the first step's compilation left out), the schedule's end moved to each check's estimate (the
rate within the warmup the same whatever the end), and one warning where the end falls within the
warmup, naming the time budget or num_train_steps that puts it there."""

import functools
import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.budget_check import budget_check_due, check_budget
from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import budget_rate, make_optimizer
from jaxformer.training.schedule_end import ScheduleEnd
from jaxformer.training.state import TrainState
from tests.training.test_budget import D_MODEL, WARMUP, peak


def test_the_pace_excludes_the_first_step_and_the_end_is_clamped(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock(seconds_before=40.0)
    clock.start()
    budget = TimeBudget(100.0, clock)
    assert budget.end_step(0, 1000) is None
    now[0] += 20.0  # the first step: compilation
    budget.step_done(1)
    assert budget.end_step(1, 1000) is None  # no pace from one step
    now[0] += 10.0  # 10 more steps at 1 s
    budget.step_done(11)
    assert budget.seconds_per_step(11) == pytest.approx(1.0)
    assert budget.end_step(11, 1000) == pytest.approx(11 + 30.0)  # 100 - (40 + 30) seconds left
    assert budget.end_step(11, 20) == 20  # never past num_train_steps
    assert not budget.spent()
    now[0] += 35.0
    assert budget.spent() and budget.end_step(11, 1000) == 12  # at least the next step


def test_the_rate_within_the_warmup_does_not_depend_on_the_schedules_end():
    """Why a new run's first evaluation, unforeseen by the estimate, costs nothing while it falls
    within the warmup (budget.py): the rate there is the same whatever the end; after it, not."""
    within = [float(budget_rate(count, end, 1.0, 100, 0.1)) for end in (150.0, 5000.0) for count in (0, 49, 98)]
    assert within[:3] == within[3:] == pytest.approx([0.01, 0.5, 0.99])  # counted from 0
    after = [float(budget_rate(119, end, 1.0, 100, 0.1)) for end in (150.0, 5000.0)]
    assert after[0] == pytest.approx(1.0 - 0.9 * 20 / 50) and after[1] > after[0]


def timed_schedule(monkeypatch, log_every_steps: int):
    """(the fake clock's seconds, the config, the learning rate, a new run's state under the budget
    schedule, its ScheduleEnd): 1,000 steps, a warmup of WARMUP, the budget checked every
    min(`log_every_steps`, 10) steps."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=WARMUP, learning_rate_scale=1.0, decay_floor=0.0)
    config.training.update(num_train_steps=1000, log_every_steps=log_every_steps)
    optimizer, learning_rate = make_optimizer(config.optimizer, D_MODEL)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    state = schedule_end.at_start(state, 0, None, timed=True)
    return now, config, learning_rate, state, schedule_end


def test_each_check_moves_the_schedules_end_to_the_estimate(monkeypatch):
    now, config, learning_rate, state, schedule_end = timed_schedule(monkeypatch, 10)
    assert schedule_end.steps(state) == 1000  # num_train_steps until a pace is known
    written = []
    writer = types.SimpleNamespace(write=lambda step, values, prefix: written.append((step, values, prefix)))
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(60.0, clock)
    now[0] = 5.0  # compilation
    budget.step_done(1)
    now[0] = 5.0 + 9 * 0.5  # then 0.5 s per step
    (spent, _, _), state = check_budget(budget, schedule_end, state, 10, writer, config.training)
    assert not spent and schedule_end.steps(state) == pytest.approx(10 + (60 - 9.5) / 0.5)
    assert written == [(10, {"seconds": 9.5, "end_step": pytest.approx(111.0)}, "budget/")]
    np.testing.assert_allclose(
        learning_rate(jnp.int32(10), state.opt_state), budget_rate(10, 111.0, peak(), WARMUP, 0.0), rtol=1e-6
    )
    now[0] = 61.0
    (spent, _, _), state = check_budget(budget, schedule_end, state, 20, writer, config.training)
    assert spent and schedule_end.steps(state) == 21  # the rate reaches its floor at the next update


def test_a_budget_spent_early_in_the_warmup_says_the_rate_was_still_rising(monkeypatch, caplog):
    """An estimate within the first quarter of the warmup is not said (compilation lowers it), but a
    budget spent there is the run's end, at the check as by the step's work (spent_by_work)."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=100, learning_rate_scale=1.0, decay_floor=0.0)
    config.training.update(num_train_steps=1000, log_every_steps=10)
    optimizer, _ = make_optimizer(config.optimizer, D_MODEL)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    writer = types.SimpleNamespace(write=lambda *args, **kwargs: None)
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(12.0, clock)
    now[0] = 5.0  # compilation
    budget.step_done(1)
    with caplog.at_level(logging.WARNING):
        now[0] = 5.0 + 9 * 0.5  # then 0.5 s per step: the end estimated at step 15, within the warmup
        (spent, _, _), state = check_budget(budget, schedule_end, state, 10, writer, config.training)
        assert not spent and not caplog.messages
        now[0] = 12.0
        (spent, _, _), state = check_budget(budget, schedule_end, state, 20, writer, config.training)
    assert spent and caplog.messages == [
        "budget schedule: the time budget ends the run near step 21, within optimizer.warmup_steps=100: the rate "
        "will still be rising when it ends; a shorter warmup (or a longer run) lets it decay"
    ]


def test_an_end_within_the_warmup_is_said_once(caplog):
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=WARMUP, learning_rate_scale=1.0, decay_floor=0.0)
    optimizer, _ = make_optimizer(config.optimizer, D_MODEL)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with caplog.at_level(logging.WARNING):
        state = schedule_end.set(state, WARMUP + 1.0)
        assert not caplog.messages  # it decays, if briefly
        state = schedule_end.set(state, WARMUP - 1.0, step=1)
        assert not caplog.messages  # too early to tell: the first estimates include compilation
        for estimate in (WARMUP - 2.0, WARMUP - 3.0):
            state = schedule_end.set(state, estimate, step=WARMUP)
    assert len(caplog.messages) == 1 and caplog.messages[0].startswith(
        f"budget schedule: the time budget ends the run near step {WARMUP - 2}, within "
        f"optimizer.warmup_steps={WARMUP}: "
    )
    assert schedule_end.steps(state) == WARMUP - 3.0  # said, not changed


def test_an_end_within_the_warmup_names_num_train_steps_where_it_ends_the_run(caplog):
    """A time budget with num_train_steps inside the warmup: the steps end the run, not the budget."""
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=WARMUP, learning_rate_scale=1.0, decay_floor=0.0)
    config.training.update(time_budget_minutes=55.0, num_train_steps=WARMUP - 5)
    optimizer, _ = make_optimizer(config.optimizer, D_MODEL)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with caplog.at_level(logging.WARNING):
        schedule_end.at_start(state, 0, None, timed=True)
    assert caplog.messages == [
        f"budget schedule: training.num_train_steps={WARMUP - 5} ends the run near step {WARMUP - 5}, within "
        f"optimizer.warmup_steps={WARMUP}: the rate will still be rising when it ends; a shorter warmup (or a "
        "longer run) lets it decay"
    ]


def resumed_schedule(saved_end, saved_training, **training):
    """(the schedule's end, the learning rate) of a time-budgeted run resumed with `training` from a
    checkpoint whose schedule ends at `saved_end`, saved with `saved_training`; whether it kept that end."""
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=WARMUP, learning_rate_scale=1.0, decay_floor=0.0)
    config.training.update(**training)
    optimizer, learning_rate = make_optimizer(config.optimizer, D_MODEL)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    saved = schedule_end.set(state, saved_end)
    resumed = schedule_end.at_start(saved, 20, saved_training, timed=True)
    return schedule_end.steps(resumed), functools.partial(learning_rate, opt_state=resumed.opt_state), resumed is saved


SAVED = {"num_train_steps": 20, "time_budget_minutes": 10.0}  # the training config the checkpoint was saved with


@pytest.mark.parametrize(
    "saved_end, training",
    [
        (20.0, {"num_train_steps": 60, "time_budget_minutes": 10.0}),  # the old length capped the estimate
        (15.0, {"num_train_steps": 60, "time_budget_minutes": 20.0}),  # the old budget's own estimate
    ],
)
def test_a_resumed_run_that_may_train_past_its_saved_end_trains_no_step_at_the_floor(saved_end, training):
    """Saved at step 20 and resumed longer (num_train_steps or the budget raised): the end moves to
    num_train_steps, a new run's guess, until the pace is measured, not held where the steps past
    it trained at rate 0 until the first check moved it."""
    end, rate, _ = resumed_schedule(saved_end, SAVED, **training)
    assert end == 60
    rates = np.array([rate(jnp.int32(count)) for count in range(20, 30)])
    expected = [budget_rate(count, 60.0, peak(), WARMUP, 0.0) for count in range(20, 30)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert rates.min() > 0


@pytest.mark.parametrize(
    "saved_end, training, kept",
    [
        (20.0, SAVED, True),  # unchanged: exact resume
        (15.0, {"num_train_steps": 60, "time_budget_minutes": 10.0}, True),  # the budget ends it before 20
        (15.0, {"num_train_steps": 20, "time_budget_minutes": 5.0}, True),  # a budget lowered: the check corrects it
        (20.0, {"num_train_steps": 18, "time_budget_minutes": 10.0}, False),  # past the length now: its cap
    ],
)
def test_a_resumed_run_keeps_its_saved_end_unless_it_may_train_past_it_or_stop_before(saved_end, training, kept):
    end, _, untouched = resumed_schedule(saved_end, SAVED, **training)
    assert (end, untouched) == ((saved_end, True) if kept else (training["num_train_steps"], False))


@pytest.mark.parametrize("timed", [True, False])
def test_a_run_resumed_at_or_past_its_length_says_no_end_moves(caplog, timed):
    """A finished run started again with a shorter length (or one shortened past the step it was
    stopped at) trains no step: the schedule's end is set to its length, but no end "moves" for a
    run that ends where it stands (it said `its end moves from step 40 to 10` at step 20). Resumed
    before its length, the move is still said."""
    config = default_config()
    config.optimizer.update(schedule="budget", warmup_steps=WARMUP, learning_rate_scale=1.0, decay_floor=0.0)
    config.training.update(num_train_steps=10, time_budget_minutes=10.0 if timed else 0.0)
    optimizer, _ = make_optimizer(config.optimizer, D_MODEL)
    params = {"w": jnp.zeros(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), rng=jax.random.key(0))
    schedule_end = ScheduleEnd(config, state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    saved = schedule_end.set(state, 40.0)
    saved_training = {"num_train_steps": 40, "time_budget_minutes": 10.0 if timed else 0.0}
    moves = {}
    for step in (20, 10, 5):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            resumed = schedule_end.at_start(saved, step, saved_training, timed=timed)
        assert schedule_end.steps(resumed) == 10  # the end is the length in every case
        moves[step] = [message for message in caplog.messages if "its end moves" in message]
    assert moves[20] == moves[10] == []
    assert len(moves[5]) == 1 and "its end moves from step 40" in moves[5][0]


def test_a_run_ends_where_its_schedule_ends_with_no_step_past_it(monkeypatch):
    """A 60-second budget at 0.3 s a step (the first, its compilation, 5 s) runs out during step
    185, estimated at step 180's check at 184.3. Checked only every 10 steps, steps 185-190 trained
    past that end at the floor (0) before step 190's check found the budget spent; the budget is
    also checked where the next step would train at or past the end: the check at step 184 moves it
    to step 185, the budget's last, the schedule's end and the floor, and the run ends there."""
    now, config, _, state, schedule_end = timed_schedule(monkeypatch, 100)
    writer = types.SimpleNamespace(write=lambda step, values, prefix: None)
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(60.0, clock)
    step, ends_read, spent = 0, {}, False
    while not spent:
        ends_read[step + 1] = schedule_end.steps(state)  # the end the step's update reads
        now[0] += 5.0 if step == 0 else 0.3
        step += 1
        budget.step_done(step)
        if budget_check_due(step, config.training.log_every_steps, schedule_end):
            (spent, _, _), state = check_budget(budget, schedule_end, state, step, writer, config.training)
    assert step == 185 and [n for n, end in ends_read.items() if n >= end] == [185]
