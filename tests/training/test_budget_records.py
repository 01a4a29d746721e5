"""The time budget's records (budget/seconds, budget/end_step) as metrics.jsonl and TensorBoard
hold them: strict JSON numbers, and no end_step before the steps' pace gives one."""

import json
import types

import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import TimeBudget, TrainingClock, check_budget
from jaxformer.training.metrics import MetricWriter


def not_json(constant):
    """json.loads' parse_constant: NaN, Infinity or -Infinity, bare, are not JSON."""
    raise AssertionError(f"{constant} in metrics.jsonl: not JSON")


def test_no_end_step_is_written_before_a_pace_is_known(tmp_path, monkeypatch):
    """A tiny run's first steps, each logged and checked (log_every_steps=1): step 1 has no pace
    (its time is the compilation's), step 2 has one."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(60.0, clock)
    training = types.SimpleNamespace(num_train_steps=1000, log_every_steps=1)
    no_schedule = types.SimpleNamespace(active=False)  # the schedule's end is not what is tested here
    writer = MetricWriter(tmp_path, enabled=True)
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
