"""jaxformer-average-checkpoints refused with a --last that the run's checkpoints cannot give
offers the --last that averages the ones it can: those there are, or the newest of one run."""

import copy
import shutil

import pytest

from jaxformer.commands import average_checkpoints
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from tests.conftest import make_workdir

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("averaging-remedies")


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


def test_where_one_checkpoint_alone_could_be_averaged_it_is_offered_as_it_is(run, capsys, tmp_path):
    """An average of one checkpoint is that checkpoint: where no other can be averaged with the
    newest (a step of another run just before it, a run that saved or kept one), the refusal
    offered nothing to use ('average fewer', or only moving the other run's out); it names the
    checkpoint to read instead."""
    checkpoints = RunDirectory(run).checkpoints
    other = make_workdir(tmp_path / "other", steps=(30,), data={"shuffle_seed": 7})[0]
    shutil.rmtree(checkpoints / "30")
    shutil.copytree(RunDirectory(other).checkpoints / "30", checkpoints / "30")
    use = (
        "use checkpoint 40 itself (an average of one is that checkpoint: give --checkpoint 40 where you would give "
        "--checkpoint averaged)"
    )
    assert average(run, capsys, 2) == (
        2,
        [
            f"error: checkpoints 30 and 40 of {checkpoints} are not of one run (step 30 -> step 40: data.shuffle_seed: "
            f"7 -> 0), so they cannot be averaged; move the other run's checkpoint out of that folder, or {use}"
        ],
    )
    for step in (10, 20, 30):
        shutil.rmtree(checkpoints / str(step))
    assert average(run, capsys, 2) == (
        2,
        [
            f"error: {run} has 1 checkpoint ([40]); cannot average the last 2: the run saved no more (it keeps up to "
            f"training.keep_checkpoints=3); {use}, or train on to save more"
        ],
    )
    writer = Checkpointer(checkpoints, keep=None)  # a run that keeps one checkpoint
    metadata = writer.read_metadata(40)
    config = copy.deepcopy(metadata.config)
    config["training"]["keep_checkpoints"] = 1
    writer.replace_metadata(40, metadata.replace(config=config))
    writer.close()
    assert average(run, capsys, 2) == (
        2,
        [
            f"error: {run} has 1 checkpoint ([40]); cannot average the last 2. {use.capitalize()}, or raise "
            "training.keep_checkpoints to keep more."
        ],
    )
    assert not RunDirectory(run).averaged.exists()
