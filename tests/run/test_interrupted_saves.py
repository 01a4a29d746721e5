"""A process killed while a parameters-only checkpoint (best/, averaged/, final/) replaces one of
its step: the previous version stays whole, readers name it, and the next writer puts it back."""

import logging
import pathlib
import shutil

import numpy as np
import pytest

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_from_directory
from tests.conftest import make_workdir

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("interrupted-saves")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(metadata, params) of a tiny model's step 20."""
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("interrupted") / "run", steps=(20,))
    reader = Checkpointer(pathlib.Path(workdir) / "checkpoints", read_only=True)
    try:
        return reader.read_params(20)
    finally:
        reader.close()


class Killed(Exception):
    """Stands for the SIGKILL that stops a save halfway."""


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_a_replacement_killed_halfway_is_named_then_put_back(saved, tmp_path, monkeypatch, caplog):
    metadata, params = saved
    folder = tmp_path / "averaged"
    writer = Checkpointer(folder, keep=None)
    writer.save_params(20, params, metadata)
    writer.close()
    doubled = [leaf * 2 for leaf in _leaves(params)]

    writer = Checkpointer(folder, keep=None)

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(writer.manager, "save", killed)
    with pytest.raises(Killed):
        writer.save_params(20, jax_tree_like(params, doubled), metadata)
    monkeypatch.undo()
    kept = folder / "20.replacing"
    assert not (folder / "20").exists() and kept.is_dir()

    with pytest.raises(CheckpointError, match=rf"holds no checkpoint; .*{kept} holds its previous version, whole"):
        load_from_directory(folder)
    assert not (folder / "20").exists()  # a reader moves nothing

    with caplog.at_level(logging.WARNING):
        Checkpointer(folder, keep=None).close()
    assert f"put back checkpoint {folder / '20'} from {kept}" in caplog.text
    step, _, restored = load_from_directory(folder)
    assert step == 20
    for got, want in zip(_leaves(restored), _leaves(params), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_replacement_killed_after_the_new_version_is_whole_sets_the_old_one_aside(saved, tmp_path, caplog):
    metadata, params = saved
    folder = tmp_path / "best"
    writer = Checkpointer(folder, keep=None)
    writer.save_params(20, params, metadata)
    writer.save_params(20, params, metadata)  # whole: the old one set aside, nothing in between left
    writer.close()
    assert sorted(path.name.partition("-")[0] for path in folder.iterdir()) == ["20", "20.replaced"]
    shutil.copytree(folder / "20", folder / "20.replacing")  # a kill after orbax's commit, before the last move
    with caplog.at_level(logging.WARNING):
        Checkpointer(folder, keep=None).close()
    assert "moved the previous checkpoint of step 20" in caplog.text
    assert sorted(path.name.partition("-")[0] for path in folder.iterdir()) == ["20", "20.replaced", "20.replaced"]


def jax_tree_like(tree, leaves):
    import jax

    return jax.tree.unflatten(jax.tree.structure(tree), leaves)


def test_partial_saves_are_removed_by_the_next_writer_with_a_warning_never_by_a_reader(saved, tmp_path, caplog):
    metadata, params = saved
    folder = tmp_path / "checkpoints"
    writer = Checkpointer(folder, keep=None)
    writer.save_params(20, params, metadata)
    writer.close()
    partial = [folder / "46.orbax-checkpoint-tmp", folder / "50.orbax-checkpoint-tmp-1765000000123456"]
    for path in partial:  # what a kill -9 during an interim save leaves
        (path / "state").mkdir(parents=True)
        (path / "state" / "d").write_bytes(b"\0" * 16)
    Checkpointer(folder, keep=None, read_only=True).close()
    assert all(path.is_dir() for path in partial)
    with caplog.at_level(logging.WARNING):
        Checkpointer(folder, keep=None).close()
    assert f"(never readable): {partial[0]}, {partial[1]}" in caplog.text
    assert sorted(path.name for path in folder.iterdir()) == ["20"]


def test_an_older_step_read_while_a_newer_ones_replacement_was_interrupted_is_said(saved, tmp_path, caplog):
    """averaged/ holding 10 and 20, 20's replacement killed halfway: the newest readable is 10, and
    reading it is said, naming 20's kept version, rather than an older average read without a word."""
    metadata, params = saved
    folder = tmp_path / "averaged"
    writer = Checkpointer(folder, keep=None)
    writer.save_params(10, params, metadata.replace(step=10))
    writer.save_params(20, params, metadata)
    writer.close()
    (folder / "20").rename(folder / "20.replacing")  # what a kill between the two moves leaves
    with caplog.at_level(logging.WARNING):
        step, _, _ = load_from_directory(folder, params=False)
    assert step == 10
    assert f"reading step 10 of {folder}; a save replacing a checkpoint was interrupted: {folder / '20.replacing'}" in (
        caplog.text
    )
