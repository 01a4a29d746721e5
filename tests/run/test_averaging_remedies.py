"""jaxformer-average-checkpoints refused with a --last that the run's checkpoints cannot give
offers the --last that averages the ones it can: those there are, or the newest of one run."""

import shutil

import pytest

from jaxformer.commands import average_checkpoints
from jaxformer.run.directory import RunDirectory
from tests.conftest import make_workdir


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A run with checkpoints 10, 20, 30 and 40 (it keeps 3: training.keep_checkpoints' default)."""
    return make_workdir(tmp_path_factory.mktemp("template") / "run", steps=(10, 20, 30, 40))[0]


@pytest.fixture
def run(template, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(template, workdir)
    return workdir


def average(workdir, capsys, last):
    code = average_checkpoints.main(["--workdir", str(workdir), "--last", str(last)])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]


def test_more_than_the_run_kept_offers_the_last_it_can_average(run, capsys):
    assert average(run, capsys, 5) == (
        2,
        [
            f"error: {run} has 4 checkpoints ([10, 20, 30, 40]); cannot average the last 5. Average fewer "
            "(--last 4), or raise training.keep_checkpoints to keep more."
        ],
    )
    for step in (10, 20):
        shutil.rmtree(RunDirectory(run).checkpoints / str(step))
    assert average(run, capsys, 3) == (
        2,
        [
            f"error: {run} has 2 checkpoints ([30, 40]); cannot average the last 3: the run saved no more (it keeps "
            "up to training.keep_checkpoints=3); average fewer (--last 2), or train on to save more"
        ],
    )
    assert not RunDirectory(run).averaged.exists()
    assert average(run, capsys, 2) == (0, [])


def test_a_step_of_another_run_offers_the_last_that_leaves_it_out(run, capsys, tmp_path):
    other = make_workdir(tmp_path / "other", steps=(20,), data={"shuffle_seed": 7})[0]
    checkpoints = RunDirectory(run).checkpoints
    shutil.rmtree(checkpoints / "20")
    shutil.copytree(RunDirectory(other).checkpoints / "20", checkpoints / "20")
    code, errors = average(run, capsys, 4)
    assert code == 2 and errors == [
        f"error: checkpoints 20 and 40 of {checkpoints} are not of one run (step 20 -> step 40: data.shuffle_seed: "
        "7 -> 0), so they cannot be averaged; move the other run's checkpoint out of that folder, or average the "
        "last 2, which are of one run (--last 2)"
    ]
    assert not RunDirectory(run).averaged.exists()
    assert average(run, capsys, 2) == (0, [])
