"""load_checkpoint (translate, evaluate) with damaged checkpoints: "latest" falls back, read-only."""

import logging
import os
import pathlib
import shutil

import numpy as np
import pytest

from jaxformer.errors import CheckpointError
from jaxformer.run.loading import load_checkpoint
from tests.conftest import make_workdir
from tests.run.test_checkpoint_integrity import flip_bit

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("checkpoint-fallback")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Parameter checkpoints of steps 20 and 40 (parameters times 1 and 2)."""
    workdir, params, _ = make_workdir(
        tmp_path_factory.mktemp("fallback") / "run", steps=(20, 40), scale=lambda step: step / 20
    )
    return pathlib.Path(workdir), params


@pytest.fixture
def workdir(run, tmp_path):
    return pathlib.Path(shutil.copytree(run[0], tmp_path / "run"))


def snapshot(directory):
    """Every file and directory under `directory` with its size, mtime and mode."""
    entries = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = pathlib.Path(root) / name
            stat = path.stat()
            entries[str(path.relative_to(directory))] = (stat.st_size, stat.st_mtime_ns, stat.st_mode)
    return entries


def flip_array_bit(step_directory, fraction=0.5):
    """Flips one bit in the middle of the step's array chunk data."""
    flip_bit(step_directory, fraction)


def first_kernel(params):
    return np.asarray(params["decoder"]["layer_0"]["feed_forward"]["wi_kernel"])


def test_latest_skips_a_damaged_newest_step_without_touching_the_workdir(workdir, run, caplog):
    _, original = run
    flip_array_bit(workdir / "checkpoints" / "40")
    before = snapshot(workdir)
    with caplog.at_level(logging.WARNING):
        step, metadata, params = load_checkpoint(workdir)
    assert step == 20 and metadata.step == 20
    np.testing.assert_array_equal(first_kernel(params), first_kernel(original))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(
        f"checkpoint 40 of {workdir / 'checkpoints'} is damaged" in w and "using step 20" in w and "params/" in w
        for w in warnings
    ), warnings
    with pytest.raises(CheckpointError, match=f"{workdir / 'checkpoints' / '40'} is damaged: array params/"):
        load_checkpoint(workdir, 40)  # asked for by number: no substitute
    assert load_checkpoint(workdir, 20)[0] == 20
    assert snapshot(workdir) == before


def test_garbage_metadata_is_an_error_naming_the_file(workdir, caplog):
    metadata_file = workdir / "checkpoints" / "40" / "metadata" / "metadata"
    metadata_file.write_bytes(np.random.default_rng(0).bytes(2000))
    before = snapshot(workdir)
    with pytest.raises(CheckpointError, match=f"cannot read {metadata_file}") as raised:
        load_checkpoint(workdir, 40)
    assert "\n" not in str(raised.value)
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(workdir, params=False)[0] == 20  # evaluate reads the metadata only
        assert load_checkpoint(workdir)[0] == 20
    assert any("checkpoint 40 of" in r.getMessage() and "using step 20" in r.getMessage() for r in caplog.records)
    assert snapshot(workdir) == before


def test_damaged_best_or_averaged_is_an_error_not_a_substitute(workdir):
    best = workdir / "best"
    best.mkdir()
    shutil.copytree(workdir / "checkpoints" / "40", best / "40")
    assert load_checkpoint(workdir, "best")[0] == 40
    flip_array_bit(best / "40")
    with pytest.raises(CheckpointError, match=f"{best / '40'} is damaged"):
        load_checkpoint(workdir, "best")


def test_no_readable_checkpoint_names_each(workdir):
    for step in (20, 40):
        flip_array_bit(workdir / "checkpoints" / str(step))
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be read: step 40: .*; step 20: "):
        load_checkpoint(workdir)


def test_a_signal_during_a_restore_is_a_stop_not_damage(workdir, monkeypatch):
    """SIGTERM while the newest checkpoint is read (a sweep's run setting up, under RaiseOnSignal)
    stops the restore; it neither tries the previous checkpoint nor sets the newest aside."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.training.signals import Stopped

    checkpointer = Checkpointer(workdir / "checkpoints")
    tried = []

    def restore(step, args):
        tried.append(step)
        raise Stopped(15)

    monkeypatch.setattr(checkpointer.manager, "restore", restore)
    before = snapshot(workdir)
    with pytest.raises(Stopped):
        checkpointer.restore_latest(None, None)
    assert tried == [40] and snapshot(workdir) == before
