"""R-Drop that starts part way through a run (training.rdrop_start): where it starts, by steps and
by time; the budget schedule's end counting the R-Drop steps to come at their cost; a real run's
plain steps equal a plain run's, its later steps are R-Drop steps, and resuming on either side of
the switch is exact; the pace of such a config is the mix of its two programs."""

import re
import shutil

import pytest

from jaxformer.training import budget as budget_module
from jaxformer.training import pace as pace_module
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.experiment import ConfigError, default_config, validate
from jaxformer.training.rdrop_start import RDROP_STEP_COST, RDropStart
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


def test_the_config_is_checked():
    config = default_config()
    config.training.rdrop_start = 0.4
    with pytest.raises(ConfigError, match=r"training.rdrop_start=0.4 with training.rdrop_alpha=0: there is no R-Drop"):
        validate(config)
    config.training.rdrop_alpha, config.training.rdrop_start = 5.0, 1.0
    with pytest.raises(ConfigError, match=r"training.rdrop_start=1.0: must be a number in \[0.0, 1.0\)"):
        validate(config)
    config.training.rdrop_start = 0.4
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
