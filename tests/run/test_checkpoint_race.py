"""Reading a workdir while a run trains in it: the run removes its older checkpoints as it saves,
so a reader (translate, evaluate, average-checkpoints, export) can find a step gone between
listing it and reading it. The newest is looked up again; a removed step is never called
damaged, and never a traceback."""

import logging
import shutil
import threading
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxformer.commands.common import _QuietLibraries
from jaxformer.errors import CheckpointError
from jaxformer.run import checkpoint as checkpoint_module
from jaxformer.run.averaging import averaged_last
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.removal import CheckpointRemoved
from tests.conftest import make_workdir

# One worker runs this file: its module fixture is made once, not once per worker.
# Removals in progress, as orbax makes them: the reads watch for the product's full time.
pytestmark = [pytest.mark.xdist_group("checkpoint-race"), pytest.mark.real_removal_watch]


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    """Checkpoints 10, 20 and 30 (step k holds k / 10 times the first parameters)."""
    workdir, params, _ = make_workdir(
        tmp_path_factory.mktemp("race") / "run", steps=(10, 20, 30), scale=lambda s: s / 10
    )
    return workdir, params


def remove_on_first_read(monkeypatch, workdir, step, method="read_params"):
    """Checkpointer.`method`(step) finds the step's folder gone, once, as a training run's clean-up would."""
    original = getattr(Checkpointer, method)
    removed = []

    def read(self, read_step, *args, **kwargs):
        if read_step == step and not removed:
            removed.append(step)
            shutil.rmtree(RunDirectory(workdir).checkpoints / str(step))
        return original(self, read_step, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, method, read)
    return removed


def first_leaf(params):
    import jax

    return np.asarray(jax.tree.leaves(params)[0])


def test_latest_removed_while_read_is_looked_up_again_not_called_damaged(run, monkeypatch, caplog):
    workdir, params = run
    removed = remove_on_first_read(monkeypatch, workdir, 30)
    with caplog.at_level(logging.WARNING):
        step, _, restored = load_checkpoint(workdir, "latest")
    assert removed == [30]
    assert step == 20
    np.testing.assert_allclose(first_leaf(restored), 2 * first_leaf(params), rtol=1e-6)
    assert not [record for record in caplog.records if "damaged" in record.getMessage()]


def test_latest_whose_metadata_is_gone_after_the_listing_is_looked_up_again(run, monkeypatch, caplog):
    workdir, _ = run
    removed = remove_on_first_read(monkeypatch, workdir, 30, method="_read_json")
    with caplog.at_level(logging.WARNING):
        step, _, _ = load_checkpoint(workdir, "latest", params=False)
    assert (removed, step) == ([30], 20)
    assert not [record for record in caplog.records if "damaged" in record.getMessage()]


def test_a_named_step_removed_while_read_is_one_line_saying_so(run, monkeypatch):
    workdir, _ = run
    remove_on_first_read(monkeypatch, workdir, 20)
    with pytest.raises(CheckpointRemoved, match=r"checkpoint .*/20 was removed while it was read.*run again"):
        load_checkpoint(workdir, 20)


def test_parameters_removed_under_the_array_reader_are_named_as_removed(run, monkeypatch):
    """tensorstore's NOT_FOUND from inside orbax's restore, the folder gone meanwhile: a removed
    checkpoint, not 'cannot restore the parameters' with tensorstore's spec in it."""
    workdir, _ = run
    original = ocp.PyTreeCheckpointer.restore

    def restore(self, path, *args, **kwargs):
        shutil.rmtree(path.parent)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", restore)
    with pytest.raises(CheckpointRemoved, match="was removed while it was read"):
        load_checkpoint(workdir, 30)


def remove_as_orbax_does(step_folder):
    """orbax's removal of a step: its files first (threads, over a while), the folder last."""
    files = sorted(path for path in step_folder.rglob("*") if path.is_file())
    first = [path for path in files if "state" in path.relative_to(step_folder).parts]  # the arrays
    for path in first:
        path.unlink()

    def the_rest():
        for path in [path for path in files if path not in first]:
            time.sleep(0.1)
            path.unlink(missing_ok=True)
        time.sleep(0.5)
        shutil.rmtree(step_folder)

    thread = threading.Thread(target=the_rest)
    thread.start()
    return thread


def test_a_checkpoint_whose_files_go_before_its_folder_is_removed_not_damaged(run, monkeypatch, caplog):
    workdir, params = run
    original = ocp.PyTreeCheckpointer.restore
    removals = []

    def restore(self, path, *args, **kwargs):
        if path.parent.name == "30" and not removals:
            removals.append(remove_as_orbax_does(path.parent))
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", restore)
    with caplog.at_level(logging.WARNING):
        step, _, restored = load_checkpoint(workdir, "latest")
    removals[0].join()
    assert step == 20
    np.testing.assert_allclose(first_leaf(restored), 2 * first_leaf(params), rtol=1e-6)
    assert not [record for record in caplog.records if "damaged" in record.getMessage()]


def test_a_checkpoint_missing_files_that_stays_is_damaged(run):
    workdir, _ = run
    state = RunDirectory(workdir).checkpoints / "20" / "state"
    for path in sorted(path for path in state.rglob("*") if path.is_file())[::2]:
        path.unlink()
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(workdir, 20)
    assert not isinstance(raised.value, CheckpointRemoved) and "20/state" in str(raised.value)
    shutil.rmtree(state)
    with pytest.raises(CheckpointError, match=r"checkpoint .*/20 is incomplete or damaged: it has no state folder$"):
        load_checkpoint(workdir, 20)


def test_the_average_lists_the_last_checkpoints_again_when_one_is_removed(run, monkeypatch):
    workdir, params = run
    Checkpointer(RunDirectory(workdir).checkpoints, keep=None).close()
    removed = remove_on_first_read(monkeypatch, workdir, 20)
    metadata, averaged = averaged_last(workdir, 2)
    assert removed == [20]
    assert metadata.averaged_steps == (10, 30)
    np.testing.assert_allclose(first_leaf(averaged), 2 * first_leaf(params), rtol=1e-6)


def test_a_listing_that_races_a_removal_is_made_again(run, monkeypatch):
    workdir, _ = run
    original, calls = ocp.CheckpointManager, []

    def manager(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # orbax reads each listed step's folder as it opens
            raise FileNotFoundError(2, "No such file or directory", str(RunDirectory(workdir).checkpoints / "10"))
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module.ocp, "CheckpointManager", manager)
    step, _, _ = load_checkpoint(workdir, "latest", params=False)
    assert (step, len(calls)) == (30, 2)


def test_a_listing_that_keeps_racing_is_one_line_not_a_traceback(run, monkeypatch):
    workdir, _ = run

    def manager(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(checkpoint_module.ocp, "CheckpointManager", manager)
    with pytest.raises(CheckpointError, match=r"changed while they were listed, 5 times .*run again") as error:
        load_checkpoint(workdir, "latest")
    assert "\n" not in str(error.value)


def test_a_checkpoint_folder_given_as_the_workdir_names_the_workdir_to_give(run):
    workdir, _ = run
    checkpoints = RunDirectory(workdir).checkpoints
    with pytest.raises(CheckpointError, match=rf"{checkpoints / '20'} is a step folder of the workdir {workdir}: "):
        load_checkpoint(checkpoints / "20", 10)
    with pytest.raises(CheckpointError, match=rf"is the checkpoints/ folder of the workdir {workdir}: give that"):
        load_checkpoint(checkpoints, "latest")
    with pytest.raises(CheckpointError, match="is not a jaxformer workdir"):
        load_checkpoint(workdir.parent, "latest")


@pytest.mark.parametrize(
    "message",
    [
        "Metadata file does not exist: /w/checkpoints/1220/_CHECKPOINT_METADATA",
        "Failed to get item metadata from directory /w/checkpoints/400/state. Either it was not present",
    ],
)
def test_orbax_warnings_about_what_jaxformer_reports_itself_stay_out_of_the_log(message):
    def record(path, level=logging.WARNING):
        return logging.LogRecord("absl", level, path, 1, message, None, None)

    quiet = _QuietLibraries()
    assert not quiet.filter(record("/site-packages/orbax/checkpoint/checkpoint_manager.py"))
    assert quiet.filter(record("/site-packages/orbax/checkpoint/checkpoint_manager.py", logging.ERROR))
    assert quiet.filter(record("/work/jaxformer/run/checkpoint.py"))


def test_a_damaged_newest_checkpoint_is_reported_once_per_process(run, caplog):
    """A command reads the metadata first (the model's shape, before any parameter), then the
    whole checkpoint: the warning came twice."""
    workdir, _ = run
    (RunDirectory(workdir).checkpoints / "30" / "metadata" / "metadata").write_text("garbage")
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(workdir, "latest", params=False)[0] == 20
        assert load_checkpoint(workdir, "latest")[0] == 20
    assert len([record for record in caplog.records if "checkpoint 30 of" in record.getMessage()]) == 1
