"""R-Drop that starts part way through a run (training.rdrop_start): where it starts, by steps and
by time; the budget schedule's end counting the R-Drop steps to come at their cost; a real run's
plain steps equal a plain run's, its later steps are R-Drop steps, and resuming on either side of
the switch is exact; the pace of such a config is the mix of its two programs.

R-Drop decided by the run's pace (training.rdrop_min_plain_steps): the decision at its step only,
from where the budget ends at the plain pace; kept through a resume; in a real run, decided for
R-Drop, the run is the fractional start at the same step, bitwise, decided against it stays plain;
the decision is stored in every checkpoint after it; resuming on either side of it is exact."""

import json
import logging
import pathlib
import re
import shutil

import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training import pace as pace_module
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.experiment import ConfigError, default_config, validate
from jaxformer.training.rdrop_start import RDROP_STEP_COST, RDropByPace, RDropPhase, RDropStart
from tests.training.test_budget import last_metrics
from tests.training.test_loop import losses, train
from tests.training.test_pace import tiny

pytestmark = pytest.mark.xdist_group("rdrop-start")


def training_section(**values):
    training = default_config().training
    training.update(values)
    return training


def test_it_starts_at_the_fraction_of_the_steps_or_of_the_time_budget_whichever_comes_first():
    assert RDropStart.from_config(training_section(rdrop_alpha=5.0)) is None  # from the first step
    assert RDropStart.from_config(training_section(rdrop_alpha=0.0)) is None
    by_steps = RDropStart.from_config(training_section(rdrop_alpha=5.0, rdrop_start=0.25, num_train_steps=40))
    assert by_steps == RDropStart(step=10.0, seconds=None)
    assert not by_steps.started(9, 1e9) and by_steps.started(10, 0.0)  # the 11th step is the first
    timed = RDropStart.from_config(
        training_section(rdrop_alpha=5.0, rdrop_start=0.4, num_train_steps=16000, time_budget_minutes=55.0)
    )
    assert timed == RDropStart(step=pytest.approx(6400.0), seconds=pytest.approx(0.4 * 55 * 60))
    assert not timed.started(6399, 1319.0)
    assert timed.started(6400, 0.0) and timed.started(10, 1320.0)
    assert timed.plain_seconds_left(10, 1300.0, 0.5) == pytest.approx(20.0)  # the time comes first
    assert timed.plain_seconds_left(6390, 0.0, 0.5) == pytest.approx(5.0)  # the steps come first
    assert timed.plain_seconds_left(7000, 2000.0, 0.5) == 0.0


@pytest.mark.parametrize(
    ("minutes", "when"),
    [(0.0, "step 20"), (10.0, "step 20 or 5.0 minutes of training, whichever comes first")],
)
def test_the_start_is_logged_with_only_the_limits_the_run_has(minutes, when, caplog):
    """Under a step budget there is no time to compare with: "whichever comes first" named one thing."""
    training = training_section(rdrop_alpha=5.0, rdrop_start=0.5, num_train_steps=40, time_budget_minutes=minutes)
    with caplog.at_level(logging.INFO, logger="jaxformer.training.rdrop_start"):
        RDropPhase(training, 0, 0.0, None)
    assert caplog.messages == [f"R-Drop starts 50% of the way through the run ({when}); plain steps before"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rdrop_start": 0.4}, r"training.rdrop_start=0.4 with training.rdrop_alpha=0: there is no R-Drop"),
        ({"rdrop_alpha": 5.0, "rdrop_start": 1.0}, r"training.rdrop_start=1.0: must be a number in \[0.0, 1.0\)"),
        ({"rdrop_min_plain_steps": 7000}, r"rdrop_min_plain_steps=7000 with training.rdrop_alpha=0: there is no R-"),
        (
            {"rdrop_alpha": 2.0, "rdrop_min_plain_steps": 7000, "rdrop_start": 0.4},
            r"rdrop_min_plain_steps=7000 and training.rdrop_start=0.4 both set",
        ),
        ({"rdrop_alpha": 2.0, "rdrop_decision_step": 0}, r"training.rdrop_decision_step=0: must be an integer >= 1"),
    ],
)
def test_the_config_is_checked(changes, message):
    config = default_config()
    config.training.update(changes)
    with pytest.raises(ConfigError, match=message):
        validate(config)


@pytest.mark.parametrize("changes", [{"rdrop_start": 0.4}, {"rdrop_min_plain_steps": 7000}])
def test_either_start_is_valid_with_r_drop(changes):
    config = default_config()
    config.training.update({"rdrop_alpha": 2.0, **changes})
    validate(config)


def test_the_schedules_end_counts_the_rdrop_steps_to_come_at_their_cost(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    clock = TrainingClock()
    clock.start()
    starts = RDropStart(step=1e9, seconds=40.0)
    budget = TimeBudget(100.0, clock, starts)
    now[0] = 5.0  # the first step: compilation
    budget.step_done(1)
    now[0] = 15.0  # 10 plain steps at 1 s
    # 25 s of plain steps, then the last 60 s at RDROP_STEP_COST s a step.
    assert budget.end_step(11, 10**6) == pytest.approx(11 + 25 + 60 / RDROP_STEP_COST)
    budget.rdrop_start = RDropStart(step=20.0, seconds=40.0)  # now the steps come first
    assert budget.end_step(11, 10**6) == pytest.approx(11 + 9 + (85 - 9) / RDROP_STEP_COST)
    budget.rdrop_start = starts

    now[0] = 40.0
    budget.step_done(36)
    budget.rdrop_started()
    assert budget.rdrop_start is None and budget.end_step(36, 10**6) is None  # a fresh pace: none yet
    now[0] = 48.0  # the first R-Drop step: its compilation
    budget.step_done(37)
    assert budget.end_step(37, 10**6) is None
    now[0] = 48.0 + 10 * 1.6  # then 1.6 s a step, measured: the estimate uses it, not the factor
    assert budget.end_step(47, 10**6) == pytest.approx(47 + (100 - 64) / 1.6)


@pytest.fixture(scope="module")
def switched_run(tmp_path_factory, data_dir):
    """40 tiny steps, R-Drop from a quarter of the way (after step 10), checkpoints every 5."""
    workdir = tmp_path_factory.mktemp("rdrop_start")
    train(workdir, data_dir, *SWITCHED)
    return workdir


SWITCHED = (
    "--config.training.rdrop_alpha=1.0",
    "--config.training.rdrop_start=0.25",
    "--config.training.checkpoint_every_steps=5",
    "--config.training.keep_checkpoints=10",
)


# R-Drop's start end to end (-m slow): two runs, for an option multi30k leaves off. When it starts
# is unit-tested above (the fraction of the steps or of the time, and the schedule's end).
@pytest.mark.slow
def test_the_first_steps_are_a_plain_runs_and_the_rest_r_drop_steps(switched_run, data_dir, tmp_path):
    plain = tmp_path / "plain"
    train(plain, data_dir, "--config.training.num_train_steps=10")  # tiny's rate does not depend on the end
    straight = losses(switched_run)
    assert [straight[step] for step in range(1, 11)] == [losses(plain)[step] for step in range(1, 11)]  # bitwise
    consistency = losses(switched_run, "train/consistency")
    assert sorted(consistency) == list(range(11, 41)) and all(value > 0 for value in consistency.values())
    assert losses(plain, "train/consistency") == {} and "consistency" not in last_metrics(plain)["train"]
    assert "consistency" in last_metrics(switched_run)["train"]


# Before the switch and after it: two more runs (-m slow). Resume is exact end to end in
# test_loop.py and test_budget.py, and the switch's step in the run above.
@pytest.mark.slow
@pytest.mark.parametrize("stopped_at", [5, 20])
def test_resuming_on_either_side_of_the_switch_is_exact(switched_run, data_dir, tmp_path, stopped_at):
    resumed = tmp_path / "resumed"
    shutil.copytree(switched_run, resumed)
    for checkpoint in (resumed / "checkpoints").iterdir():
        if checkpoint.name.isdigit() and int(checkpoint.name) > stopped_at:
            shutil.rmtree(checkpoint)
    result = train(resumed, data_dir, *SWITCHED)
    assert f"resumed from step {stopped_at}" in result.stderr
    assert ("R-Drop starts after step 10" in result.stderr) == (stopped_at < 10)
    straight, again = losses(switched_run), losses(resumed)
    assert [again[step] for step in range(stopped_at + 1, 41)] == [straight[step] for step in range(stopped_at + 1, 41)]
    assert sorted(step for step in losses(resumed, "train/consistency") if step > stopped_at) == list(
        range(max(stopped_at, 10) + 1, 41)
    )


@pytest.mark.slow  # a wall-clock run
def test_a_time_budget_starts_r_drop_at_its_fraction_of_the_time(data_dir, tmp_path):
    workdir = tmp_path / "timed"
    result = train(
        workdir,
        data_dir,
        "--config.optimizer.schedule=budget",
        "--config.training.rdrop_alpha=1.0",
        "--config.training.rdrop_start=0.5",
        "--config.training.time_budget_minutes=0.5",
        "--config.training.num_train_steps=1000000",
        "--config.training.log_every_steps=10",
        "--config.training.checkpoint_every_steps=1000000",
        "--config.training.eval_every_steps=1000000",
    )
    switched_after = int(re.search(r"R-Drop starts after step (\d+) ", result.stderr).group(1))
    seconds = losses(workdir, "budget/seconds")
    assert seconds[switched_after] >= 15.0  # half of the 30 s budget
    assert all(value < 15.0 for step, value in seconds.items() if step < switched_after)
    consistency = losses(workdir, "train/consistency")
    assert consistency and min(consistency) > switched_after and last_metrics(workdir)["ended_by"] == "time budget"


@pytest.mark.slow  # to the slow set (about 12 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_a_switching_configs_pace_is_the_mix_of_its_two_programs(monkeypatch):
    """Each program's step made to take a known time: plain 1 s, R-Drop RDROP_STEP_COST s."""
    now = [0.0]
    monkeypatch.setattr(pace_module.time, "perf_counter", lambda: now[0])

    def fake_step(self):
        now[0] += RDROP_STEP_COST if self.rdrop else 1.0

    monkeypatch.setattr(pace_module.ConfigTrainStep, "__call__", fake_step)
    monkeypatch.setattr(pace_module.ConfigTrainStep, "compile", lambda self, compiler_options=None: None)
    switching = tiny("training.rdrop_alpha=1.0", "training.rdrop_start=0.25")
    pace = pace_module.relative_pace(switching, tiny())
    assert pace.timed and pace.seconds_per_step == pytest.approx(0.25 + 0.75 * RDROP_STEP_COST)
    assert pace.reference_seconds_per_step == pytest.approx(1.0)
    # Against R-Drop from the first step: the same programs, in other shares, so timed.
    pace = pace_module.relative_pace(switching, tiny("training.rdrop_alpha=1.0"))
    assert pace.timed and pace.speed == pytest.approx(RDROP_STEP_COST / (0.25 + 0.75 * RDROP_STEP_COST))


def paced(**values):
    rule = dict(rdrop_alpha=2.0, rdrop_min_plain_steps=7000, rdrop_decision_step=600, time_budget_minutes=55.0)
    return training_section(**{**rule, **values})


def test_the_rule_needs_r_drop_and_a_time_budget():
    assert RDropByPace.from_config(paced(), None) == RDropByPace(7000, 600, None)
    assert RDropByPace.from_config(paced(time_budget_minutes=0.0), None) is None  # a step budget: as configured
    assert RDropByPace.from_config(paced(rdrop_min_plain_steps=0), None) is None
    assert RDropByPace.from_config(paced(rdrop_alpha=0.0), None) is None


def test_it_decides_once_at_its_step_from_the_plain_pace():
    phase = RDropPhase(paced(), step=0, seconds=0.0, decision=None)
    assert phase.switches and not phase.started and phase.decision is None and phase.to_come is None
    assert not phase.due(590) and not phase.starts_after(590, 400.0, plain_end_step=50_000.0)  # not its step
    assert phase.due(600) and not phase.starts_after(600, 410.0, plain_end_step=None)  # no pace yet: not decided
    assert phase.decision is None and phase.due(610)
    assert phase.starts_after(610, 420.0, plain_end_step=7000.0) and phase.started and phase.decision is True
    assert not phase.due(620) and not phase.starts_after(620, 430.0, plain_end_step=1.0)  # decided once

    slow = RDropPhase(paced(), step=0, seconds=0.0, decision=None)
    assert not slow.starts_after(600, 450.0, plain_end_step=6999.0)
    assert slow.decision is False and not slow.started and not slow.due(1000)
    assert not slow.starts_after(5000, 3000.0, plain_end_step=10**6)  # plain to the end

    # Resumed: the stored decision holds, whatever the pace now.
    assert RDropPhase(paced(), step=2000, seconds=900.0, decision=True).started
    resumed = RDropPhase(paced(), step=2000, seconds=900.0, decision=False)
    assert not resumed.started and not resumed.due(2010)
    assert not resumed.starts_after(2010, 910.0, plain_end_step=10**6)
    # Resumed from a checkpoint without a decision (written before the rule was set): the next check decides.
    undecided = RDropPhase(paced(), step=2000, seconds=900.0, decision=None)
    assert undecided.due(2010) and undecided.starts_after(2010, 910.0, plain_end_step=8000.0)

    # Without a time budget: R-Drop from the first step, as configured.
    stepped = RDropPhase(paced(time_budget_minutes=0.0), step=0, seconds=0.0, decision=None)
    assert stepped.started and not stepped.switches and stepped.decision is None


# A time budget far above the tiny run's 40 steps: the steps cap ends the run, the estimate at
# step 10 is 40 (num_train_steps), and the decision follows rdrop_min_plain_steps alone.
PACED = (
    "--config.training.rdrop_alpha=1.0",
    "--config.training.rdrop_decision_step=10",
    "--config.training.time_budget_minutes=30",
    "--config.training.checkpoint_every_steps=5",
    "--config.training.keep_checkpoints=10",
)


def stored_decisions(workdir):
    checkpoints = pathlib.Path(workdir) / "checkpoints"
    return {
        int(path.name): json.loads((path / "metadata" / "metadata").read_text()).get("rdrop_by_pace")
        for path in checkpoints.iterdir()
        if path.name.isdigit()
    }


@pytest.fixture(scope="module")
def decided_run(tmp_path_factory, data_dir):
    """40 tiny steps whose pace decides for R-Drop at step 10 (the budget buys 40 >= 40 plain steps)."""
    workdir = tmp_path_factory.mktemp("rdrop_by_pace")
    result = train(workdir, data_dir, *PACED, "--config.training.rdrop_min_plain_steps=40")
    return workdir, result.stderr


# The pace's decision, end to end (-m slow): two runs. The decision itself (once, at its step, from
# the plain pace) is unit-tested above.
@pytest.mark.slow
def test_decided_for_r_drop_the_run_is_a_fractional_start_at_the_same_step(decided_run, switched_run):
    workdir, stderr = decided_run
    assert "at step 10 the time budget buys about 40 plain steps at their pace so far, at least 40" in stderr
    assert "R-Drop starts after step 10" in stderr
    assert losses(workdir) == losses(switched_run)  # R-Drop after step 10 of 40 by the fraction: bitwise, all 40 steps
    assert sorted(losses(workdir, "train/consistency")) == list(range(11, 41))
    assert stored_decisions(workdir) == {5: None, 10: True, 15: True, 20: True, 25: True, 30: True, 35: True, 40: True}


@pytest.mark.slow
def test_decided_against_r_drop_the_run_stays_plain(decided_run, data_dir, tmp_path):
    workdir = tmp_path / "paced"
    result = train(workdir, data_dir, *PACED, "--config.training.rdrop_min_plain_steps=41")
    assert "fewer than 41 (training.rdrop_min_plain_steps): plain steps to the end" in result.stderr
    assert "R-Drop starts" not in result.stderr and losses(workdir, "train/consistency") == {}
    straight = losses(decided_run[0])  # plain to step 10 as well
    assert [losses(workdir)[step] for step in range(1, 11)] == [straight[step] for step in range(1, 11)]
    assert all(losses(workdir)[step] != straight[step] for step in range(11, 41))  # R-Drop steps differ
    assert stored_decisions(workdir)[40] is False and stored_decisions(workdir)[5] is None


@pytest.mark.slow  # two more runs; resume is exact end to end in test_loop.py and above
@pytest.mark.parametrize("stopped_at", [5, 20])
def test_resuming_on_either_side_of_the_decision_is_exact(decided_run, data_dir, tmp_path, stopped_at):
    workdir, _ = decided_run
    resumed = tmp_path / "resumed"
    shutil.copytree(workdir, resumed)
    for checkpoint in (resumed / "checkpoints").iterdir():
        if checkpoint.name.isdigit() and int(checkpoint.name) > stopped_at:
            shutil.rmtree(checkpoint)
    result = train(resumed, data_dir, *PACED, "--config.training.rdrop_min_plain_steps=40")
    assert f"resumed from step {stopped_at}" in result.stderr
    assert ("the time budget buys" in result.stderr) == (stopped_at < 10)  # after it, the stored decision holds
    assert ("at step 10 the time budget buys" in result.stderr) == (stopped_at < 10)
    straight, again = losses(workdir), losses(resumed)
    assert [again[step] for step in range(stopped_at + 1, 41)] == [straight[step] for step in range(stopped_at + 1, 41)]
    assert stored_decisions(resumed)[40] is True
