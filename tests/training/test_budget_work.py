"""The periodic work (evaluations, validation BLEU, checkpoints) in a time budget's estimate of
its end: each kind foreseen where it falls at its steady duration, measured apart from the steps'
pace, a segment's first of a kind (its compilation included) standing for none to come, one slowed
by a passing load outvoted by the kind's others, and the durations carried over a resume. A fake
clock; TimeBudget.end_step checked against a walk."""

import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training.budget import TimeBudget, TrainingClock


def test_the_estimate_foresees_the_periodic_work_due_before_the_end(monkeypatch):
    """A 5-second evaluation every 100 steps: measured, it is kept out of the steps' pace and
    counted where it falls, so an end it would push the run past is the step it runs at."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(38.0, clock, work_every={"evaluate": 100, "bleu": 0})
    now[0] = 1.0  # the first step: compilation
    budget.step_done(1)
    now[0] += 24 * 0.2  # steps 2-25 at 0.2 s
    budget.work_done("evaluate", 8.0)  # at step 25 (as if due then): the first, its compilation included
    assert budget.work_seconds == {}  # no steady duration
    now[0] += 8.0 + 25 * 0.2  # then to step 50
    budget.work_done("evaluate", 5.0)  # at step 50: measured, not the steps' pace
    now[0] += 5.0 + 40 * 0.2  # then to step 90: 31.8 s spent, 6.2 s left
    assert budget.seconds_per_step(90) == pytest.approx(0.2)
    # Steps 90-99 take 2 s, step 100's evaluation 5 more: the budget runs out during it.
    assert budget.end_step(90, 5000) == pytest.approx(100.0)
    budget.work_seconds["evaluate"] = 1.0  # a shorter one: through it, then 3.2 s of steps after it
    assert budget.end_step(90, 5000) == pytest.approx(100 + 3.2 / 0.2)
    # Carried over a resume: the new segment foresees the evaluation before it has run one.
    resumed = TimeBudget(38.0, TrainingClock(32.0), work_every={"evaluate": 100}, work_seconds=budget.work_seconds)
    resumed.clock.start()
    resumed.step_done(91)
    now[0] += 9 * 0.2  # at step 100, 4.2 s left: its evaluation (1 s), then 3.2 s of steps
    assert resumed.work_seconds == {"evaluate": 1.0} and resumed.end_step(100, 5000) == pytest.approx(100 + 3.2 / 0.2)


def walked_end(step: int, seconds_left: float, pace: float, every: int, work: float) -> float:
    """Where a budget of `seconds_left` at `step` runs out, walked a step at a time: `pace` seconds a
    step, `work` seconds at each multiple of `every` (step's own still to run); TimeBudget.end_step's reference."""
    while True:
        seconds_left -= work if step % every == 0 else 0.0
        if seconds_left <= 0:
            return float(step)  # during this step's work
        if seconds_left < pace:
            return step + seconds_left / pace  # during the step after it
        seconds_left, step = seconds_left - pace, step + 1


def budget_past_its_first_step(monkeypatch, seconds: float, work_every: dict[str, int]):
    """(the fake clock's seconds, a new TimeBudget of `seconds` on it whose first step, its
    compilation, took 1 s)."""
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    budget = TimeBudget(seconds, clock, work_every=work_every)
    now[0] = 1.0  # the first step: compilation
    budget.step_done(1)
    return now, budget


def test_a_first_evaluation_holding_its_compilation_does_not_stand_for_those_to_come(monkeypatch):
    """A 20-second first evaluation (compilation included) and 1-second ones after it: the first is
    spent but not foreseen at every later one, the second sets the duration the checkpoints keep,
    and a resumed segment's first (compiled again) keeps the one its checkpoint saved."""
    now, budget = budget_past_its_first_step(monkeypatch, 300.0, {"evaluate": 50})
    now[0] += 49 * 0.1  # steps 2-50 at 0.1 s
    before = budget.end_step(50, 10**6)
    budget.work_done("evaluate", 20.0)  # step 50's, the first: compilation
    now[0] += 20.0 + 10 * 0.1  # then to step 60
    # It cost its own seconds, and no more to come (foreseen at 20 s each, the end would be step 600).
    assert budget.end_step(60, 10**6) == pytest.approx(before - 20.0 / 0.1)
    assert budget.work_seconds == {}
    now[0] += 40 * 0.1  # to step 100
    budget.work_done("evaluate", 1.0)  # the second: steady
    now[0] += 1.0 + 10 * 0.1  # then to step 110: 32.9 s spent
    assert budget.work_seconds == {"evaluate": 1.0}
    assert budget.end_step(110, 10**6) == pytest.approx(walked_end(110, 300.0 - 32.9, 0.1, 50, 1.0))

    # Resumed from step 100's checkpoint (31.9 s spent, the steady duration kept).
    resumed = TimeBudget(300.0, TrainingClock(31.9), work_every={"evaluate": 50}, work_seconds=budget.work_seconds)
    resumed.clock.start()
    resumed.step_done(101)  # its compilation spent before the pace is measured, as above
    now[0] += 49 * 0.1  # steps 102-150
    resumed.work_done("evaluate", 20.0)  # this segment's first: compiled again
    now[0] += 20.0 + 10 * 0.1  # then to step 160: 57.8 s spent
    assert resumed.work_seconds == {"evaluate": 1.0}  # what its checkpoints keep
    assert resumed.end_step(160, 10**6) == pytest.approx(walked_end(160, 300.0 - 57.8, 0.1, 50, 1.0))


def lower_median(durations: list[float]) -> float:
    """The lower middle of the last three of `durations` sorted: the steady duration's reference."""
    last = sorted(durations[-3:])
    return last[(len(last) - 1) // 2]


def test_one_slowed_evaluation_among_steady_ones_does_not_stand_for_those_to_come(monkeypatch):
    """1-second evaluations every 50 steps and one slowed to 8 s by a passing load: the steady
    duration is the lower median of those measured, so the slowed one is spent but not foreseen
    while the others outvote it, and two slowed in three are; a resumed segment counts the
    duration its checkpoint saved as one of them."""
    now, budget = budget_past_its_first_step(monkeypatch, 300.0, {"evaluate": 50})
    now[0] += 49 * 0.1  # steps 2-50 at 0.1 s
    budget.work_done("evaluate", 20.0)  # step 50's, the first: compilation
    now[0] += 20.0 + 50 * 0.1  # then to step 100
    budget.work_done("evaluate", 1.0)  # steady
    now[0] += 1.0 + 50 * 0.1  # then to step 150
    budget.work_done("evaluate", 8.0)  # slowed by a passing load
    now[0] += 8.0 + 10 * 0.1  # then to step 160: 45.9 s spent
    measured = [1.0, 8.0]
    assert budget.end_step(160, 10**6) == pytest.approx(walked_end(160, 300.0 - 45.9, 0.1, 50, 1.0))
    assert budget.work_seconds == {"evaluate": lower_median(measured)} == {"evaluate": 1.0}

    now[0] += 40 * 0.1  # to step 200
    budget.work_done("evaluate", 8.0)  # slowed again: two of three
    now[0] += 8.0 + 10 * 0.1  # then to step 210: 58.9 s spent
    assert budget.work_seconds == {"evaluate": lower_median([*measured, 8.0])} == {"evaluate": 8.0}
    moved = budget.end_step(210, 10**6)
    assert moved == pytest.approx(walked_end(210, 300.0 - 58.9, 0.1, 50, 8.0))
    assert moved < walked_end(210, 300.0 - 58.9, 0.1, 50, 1.0) - 100  # foreseen at 8 s each, far earlier

    # Resumed from a checkpoint that saved 1 s (49.9 s spent): its first check foresees it as before.
    resumed = TimeBudget(300.0, TrainingClock(49.9), work_every={"evaluate": 50}, work_seconds={"evaluate": 1.0})
    resumed.clock.start()
    resumed.step_done(201)
    now[0] += 9 * 0.1  # steps 202-210: 50.8 s spent
    assert resumed.end_step(210, 10**6) == pytest.approx(walked_end(210, 300.0 - 50.8, 0.1, 50, 1.0))
    now[0] += 40 * 0.1  # to step 250
    resumed.work_done("evaluate", 20.0)  # this segment's first: compiled again, not measured
    now[0] += 20.0 + 50 * 0.1  # to step 300
    resumed.work_done("evaluate", 8.0)  # its first measured, slowed: outvoted by the carried one
    now[0] += 8.0 + 10 * 0.1  # then to step 310: 88.8 s spent
    assert resumed.work_seconds == {"evaluate": lower_median([1.0, 8.0])} == {"evaluate": 1.0}
    assert resumed.end_step(310, 10**6) == pytest.approx(walked_end(310, 300.0 - 88.8, 0.1, 50, 1.0))


def test_a_drifting_duration_is_followed_within_two_of_its_kind(monkeypatch):
    """Evaluations that settle at 1 s and then take 5 s each (validation BLEU's outputs grown
    longer, say): the median of the last three follows them at the second 5 s, where a median of
    every one measured would still foresee 1 s."""
    now, budget = budget_past_its_first_step(monkeypatch, 300.0, {"evaluate": 50})
    budget.work_done("evaluate", 20.0)  # the first: compilation
    measured = []
    for seconds in (1.0, 1.0, 1.0, 5.0):
        budget.work_done("evaluate", seconds)
        measured.append(seconds)
    assert budget.work_seconds == {"evaluate": lower_median(measured)} == {"evaluate": 1.0}
    budget.work_done("evaluate", 5.0)
    measured.append(5.0)
    assert budget.work_seconds == {"evaluate": lower_median(measured)} == {"evaluate": 5.0}
    assert sorted(measured)[(len(measured) - 1) // 2] == 1.0  # every one's lower median: still 1 s
