"""training.init_from (or init_encoder_from, init_decoder_from) naming a folder that does not exist
where a new run starts, such as the new run's own --workdir: refused saying so, before the run
makes its workdir (which would then exist, holding no checkpoint) or reads any data."""

import re

import pytest

from jaxformer.errors import CheckpointError
from jaxformer.training.loop import train_and_evaluate
from tests.training.test_init_from import tiny_config


@pytest.mark.parametrize("key", ["init_from", "init_encoder_from"])
def test_a_start_in_the_runs_own_new_workdir_is_refused_as_missing(tmp_path, no_data, key):
    workdir = tmp_path / "tuned"
    given = {"init_from": workdir, "init_encoder_from": workdir / "best"}[key]
    config = tiny_config(tmp_path / "tfds", **{key: str(given)})
    where = "this run's own --workdir" if given == workdir else f"in this run's own --workdir {workdir}"
    expected = f"training.{key}: {given} does not exist (it is {where}: give the workdir of the run to start from)"
    with pytest.raises(CheckpointError, match=f"^{re.escape(expected)}$"):
        train_and_evaluate(config, workdir)
    assert not workdir.exists()


def test_a_start_in_an_existing_workdir_without_checkpoints_keeps_its_message(tmp_path, no_data):
    """A workdir that is there is read as before: one that holds no checkpoint is said to hold none."""
    workdir = tmp_path / "tuned"
    workdir.mkdir()
    config = tiny_config(tmp_path / "tfds", init_from=str(workdir))
    expected = f"training.init_from: {workdir / 'checkpoints'} holds no checkpoint"
    with pytest.raises(CheckpointError, match=f"^{re.escape(expected)}$"):
        train_and_evaluate(config, workdir)
    assert list(workdir.iterdir()) == []  # as it was
