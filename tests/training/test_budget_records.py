"""The time budget's records (budget/seconds, budget/end_step) as metrics.jsonl and TensorBoard
hold them: strict JSON numbers, no end_step before the steps' pace gives one, and a step whose
evaluation spent the budget after its check recorded with the end its schedule was set to."""

import json
import types

import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.budget_check import HeldRecord, check_budget, spent_by_work
from jaxformer.training.metrics import MetricWriter
from tests.training.test_budget_unmeasured import COMPILED, first_step_done


def not_json(constant):
    """json.loads' parse_constant: NaN, Infinity or -Infinity, bare, are not JSON."""
    raise AssertionError(f"{constant} in metrics.jsonl: not JSON")


def logged_checks(tmp_path, monkeypatch, budget_seconds, log_every_steps):
    """(the fake clock's seconds, a budget of `budget_seconds` on it, the training section, a schedule
    whose end is not what is tested, a metrics writer in tmp_path) for check_budget."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    training = types.SimpleNamespace(num_train_steps=1000, log_every_steps=log_every_steps)
    no_schedule = types.SimpleNamespace(active=False)
    return now, TimeBudget(budget_seconds, clock), training, no_schedule, MetricWriter(tmp_path, enabled=True)


def test_no_end_step_is_written_before_a_pace_is_known(tmp_path, monkeypatch):
    """A tiny run's first steps, each logged and checked (log_every_steps=1): step 1 has no pace
    (its time is the compilation's), step 2 has one."""
    now, budget, training, no_schedule, writer = logged_checks(tmp_path, monkeypatch, 60.0, log_every_steps=1)
    to_tensorboard = []  # what its TensorBoard writer is given (read back from the file in test_tensorboard.py)
    real_write = writer._tensorboard.write
    writer._tensorboard.write = lambda step, values: to_tensorboard.append((step, *values)) or real_write(step, values)
    for step, seconds in ((1, 5.0), (2, 5.5), (3, 6.0)):
        now[0] = seconds
        budget.step_done(step)
        reading, _ = check_budget(budget, no_schedule, None, step, writer, training)
        assert (reading.end_step is None) == (step == 1)
    writer.close()

    records = [json.loads(line, parse_constant=not_json) for line in (tmp_path / "metrics.jsonl").open()]
    assert [record["step"] for record in records] == [1, 2, 3]
    assert "budget/end_step" not in records[0] and records[0]["budget/seconds"] == 5.0
    ends = [record["budget/end_step"] for record in records[1:]]
    assert all(type(end) is float for end in ends)
    assert ends == [pytest.approx(2 + (60 - 5.5) / 0.5), pytest.approx(3 + (60 - 6.0) / 0.5)]
    assert to_tensorboard == [(1, "budget/seconds"), *[(step, "budget/seconds", "budget/end_step") for step in (2, 3)]]


def test_an_evaluation_that_spends_the_budget_after_the_check_is_in_the_steps_record(tmp_path, monkeypatch):
    """As the loop does it (HeldRecord): the check at step 10 leaves time, and so does step 10's
    evaluation: the end is estimated again after it, and the step's record says that estimate. The
    check at step 20 leaves time too, then step 20's evaluation spends the budget: the schedule
    ends at step 21, and step 20's one budget record says so, with the seconds then, as the saved
    state's schedule does (a loaded machine's run recorded the check's estimate, 92.7, where its
    state ended at 41)."""
    now, budget, schedule_end, state, training, *_ = first_step_done(monkeypatch, "budget", 10)
    budget.seconds = 60.0  # the first step (compilation) left time
    writer = MetricWriter(tmp_path, enabled=True)
    held = HeldRecord(writer)
    readings, spent, ends_after_work = [], [], []
    for step, evaluation in ((10, 2.0), (20, 50.0)):
        now[0] += 9 * 0.5 if step == 10 else 10 * 0.5  # 0.5 s a step
        reading, state = check_budget(budget, schedule_end, state, step, held, training)
        readings.append(reading)
        now[0] += evaluation  # the step's evaluation
        budget.work_done("evaluate", evaluation)
        spent_now, state = spent_by_work(budget, schedule_end, state, step, held)
        spent.append(spent_now)
        ends_after_work.append(schedule_end.steps(state))
        held.write_held()  # before the step's checkpoint
        held.write_held()  # once
    writer.close()

    assert [reading.spent for reading in readings] == [False, False] and spent == [False, True]
    assert readings[1].end_step > 21  # the check left time: the evaluation overtook its estimate
    records = [json.loads(line, parse_constant=not_json) for line in (tmp_path / "metrics.jsonl").open()]
    assert [record["step"] for record in records] == [10, 20]
    # Not spent: the end estimated again after the evaluation, 2 s (4 steps) earlier than the check's,
    # as the schedule read it until step 20 (the check's, kept, left a kind's first, its compilation
    # unforeseen, to end the run above its floor).
    assert records[0]["budget/end_step"] == pytest.approx(readings[0].end_step - 2.0 / 0.5) == ends_after_work[0]
    assert records[1]["budget/end_step"] == 21.0 == schedule_end.steps(state)
    assert records[1]["budget/seconds"] == now[0] == pytest.approx(COMPILED + 19 * 0.5 + 2.0 + 50.0)  # not the check's


def test_a_check_between_log_steps_that_finds_the_budget_spent_is_recorded(tmp_path, monkeypatch):
    """The budget is also checked where the next step reaches the schedule's end, between log steps:
    one there that finds it spent makes that step the run's last, whose budget/ record (the end set
    at the next step) was left out, only log steps having one."""
    now, budget, training, no_schedule, writer = logged_checks(tmp_path, monkeypatch, 10.0, log_every_steps=10)
    for step, seconds in ((1, 1.0), (2, 2.0), (10, 8.0), (14, 10.5)):
        now[0] = seconds
        budget.step_done(step)
        reading, _ = check_budget(budget, no_schedule, None, step, writer, training)
    assert reading.spent
    writer.close()
    records = {record["step"]: record for record in map(json.loads, (tmp_path / "metrics.jsonl").open())}
    assert sorted(records) == [10, 14]
    assert records[14]["budget/seconds"] == 10.5 and records[14]["budget/end_step"] == 15.0
