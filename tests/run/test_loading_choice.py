"""training.init_checkpoint with a training.init_from that names a folder of steps or one step's
directory rather than a workdir: honoured, or refused in one line; never ignored. A checkpoint
choice from Python read as the command line's --checkpoint reads it."""

import numpy as np
import pytest

from jaxformer.errors import CheckpointError
from jaxformer.run.loading import load_checkpoint, locate_checkpoint
from tests.conftest import make_workdir

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("loading-choice")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("steps"), steps=(10, 20, 30))
    return workdir


def start(init_from, init_checkpoint="latest"):
    """The step that training.init_from / init_checkpoint start a run from."""
    from jaxformer.training import experiment
    from jaxformer.training.init_from import load_starting_points

    training = experiment.default_config().training
    training.init_from, training.init_checkpoint = str(init_from), init_checkpoint
    (point,) = load_starting_points(training)
    return point.step


def refusal(init_from, init_checkpoint):
    with pytest.raises(CheckpointError) as raised:
        start(init_from, init_checkpoint)
    message = str(raised.value)
    assert "\n" not in message
    assert f"training.init_from (training.init_checkpoint={init_checkpoint!r}): {init_from}" in message
    return message


def test_a_folder_of_steps_takes_the_chosen_step(workdir):
    checkpoints = workdir / "checkpoints"
    assert start(checkpoints, "10") == 10  # was 30, the newest, whatever the choice
    assert start(checkpoints, "20") == 20
    assert start(checkpoints) == 30
    assert locate_checkpoint(checkpoints, 20) == (checkpoints, 20)
    message = refusal(checkpoints, "15")
    assert "has no checkpoint for step 15; it has [10, 20, 30]" in message


def test_a_kind_with_a_folder_of_steps_is_refused(workdir):
    checkpoints = workdir / "checkpoints"
    for kind in ("best", "averaged", "final"):
        message = refusal(checkpoints, kind)  # was checkpoints/'s newest, silently
        assert "a folder of steps, not a workdir" in message
        assert "its steps [10, 20, 30]" in message and f"give the workdir {workdir}" in message


def test_a_step_directory_takes_no_other_choice(workdir):
    step_10 = workdir / "checkpoints" / "10"
    assert start(step_10) == 10
    for choice in ("20", "10", "best"):  # "20" used step 10, silently
        message = refusal(step_10, choice)
        assert "is the directory of step 10" in message and "keep 'latest'" in message
        assert f"give its folder {workdir / 'checkpoints'} to choose among [10, 20, 30]" in message


def metadata_step(workdir, checkpoint):
    return load_checkpoint(workdir, checkpoint, params=False)[0]


@pytest.mark.parametrize("load", [metadata_step, locate_checkpoint], ids=["load_checkpoint", "locate_checkpoint"])
def test_a_step_as_digits_is_that_step_and_other_types_are_refused_in_one_line(workdir, load):
    expected = 20 if load is metadata_step else (workdir / "checkpoints", 20)
    for step in ("20", 20, np.int64(20)):  # "20" as --checkpoint 20 gives it
        assert load(workdir, step) == expected
    choices = "latest, best, averaged, final or a step number"
    for choice in (True, False, 20.0, None, b"20"):  # locate_checkpoint read True as step 1, silently
        with pytest.raises(TypeError) as raised:
            load(workdir, choice)
        assert str(raised.value) == f"checkpoint={choice!r}: give {choices} (an int, or its digits as a str)"
    for choice in ("twenty", "-20", " 20", "\u00b2"):  # a superscript 2 passed isdigit(), then int() failed
        with pytest.raises(ValueError) as raised:
            load(workdir, choice)
        assert str(raised.value) == f"checkpoint {choice!r}: choose one of {choices}"
    with pytest.raises(ValueError, match=r"^checkpoint=-20: a step number is not negative$"):
        load(workdir, -20)
