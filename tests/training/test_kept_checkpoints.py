"""The keep rule (training.keep_checkpoints) applied where orbax, which applies it only inside a
save, does not: at the end of a run resumed after its last checkpoint, which saves nothing."""

import numpy as np

from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training.kept_checkpoints import lost_by_lowering, remove_beyond_keep, remove_interim_before

METADATA = CheckpointMetadata(config={}, model={}, tokenizer=b"\0", data_fingerprint=None, step=0)


def checkpoints(directory, steps, interim=()):
    """A checkpointer of `directory` holding parameters-only checkpoints of `steps`."""
    checkpointer = Checkpointer(directory, keep=None)
    for step in steps:
        metadata = METADATA.replace(step=step, interim=step in interim)
        checkpointer.save_params(step, {"w": np.full(2, step, np.float32)}, metadata)
    return checkpointer


def test_the_scheduled_checkpoints_beyond_keep_are_removed(tmp_path):
    """Killed after checkpoint 40 was written, before orbax removed 25 (keep 3): the run's end removes it."""
    checkpointer = checkpoints(tmp_path, (25, 30, 35, 40))
    assert remove_beyond_keep(checkpointer, 3) == [25]
    assert checkpointer.steps() == [30, 35, 40]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["30", "35", "40"]
    assert remove_beyond_keep(checkpointer, 3) == [] and checkpointer.steps() == [30, 35, 40]
    checkpointer.close()


def test_an_interim_checkpoint_pushes_no_scheduled_one_out(tmp_path):
    """As in a save: an interim checkpoint (saved on a signal) is not counted, and stays for the
    next checkpoint to delete."""
    checkpointer = checkpoints(tmp_path, (20, 25, 30, 35, 37), interim=(37,))
    assert remove_beyond_keep(checkpointer, 3) == [20]
    assert checkpointer.steps() == [25, 30, 35, 37]
    remove_interim_before(checkpointer, 40)
    assert checkpointer.steps() == [25, 30, 35]
    checkpointer.close()


def test_lowering_the_keep_loses_what_the_old_keep_would_have_kept():
    """Against the rule applied by hand: orbax keeps the newest `keep` with the new checkpoint among
    them; a run that saves no more keeps the newest `keep` of those it has."""
    scheduled = [10, 20, 30, 40, 50]
    for kept_before in range(1, 8):
        for keep in range(1, 8):
            for saves_again in (True, False):
                existing = scheduled + [60] if saves_again else scheduled
                survives = {k: set(existing[-k:]) for k in (kept_before, keep)}
                expected = [step for step in scheduled if step in survives[kept_before] - survives[keep]]
                assert lost_by_lowering(scheduled, kept_before, keep, saves_again) == expected
    assert lost_by_lowering(scheduled, 5, 2, saves_again=True) == [20, 30, 40]  # 10 goes either way
    assert lost_by_lowering(scheduled, 5, 2, saves_again=False) == [10, 20, 30]
    assert lost_by_lowering([40], 3, 1, saves_again=False) == []  # nothing beyond the lower keep
