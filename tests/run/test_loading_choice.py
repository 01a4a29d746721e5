"""training.init_checkpoint with a training.init_from that names a folder of steps or one step's
directory rather than a workdir: honoured, or refused in one line; never ignored."""

import pytest

from jaxformer.errors import CheckpointError
from jaxformer.run.loading import locate_checkpoint
from tests.conftest import make_workdir


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
