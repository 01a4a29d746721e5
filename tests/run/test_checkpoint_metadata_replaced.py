"""A checkpoint's metadata replaced in place (a run's interim checkpoint made its last): whole at
every instant, with its old metadata or its new, its arrays and data position kept and verified."""

import os

import jax
import numpy as np
import pytest

from jaxformer.errors import UserError
from jaxformer.run.checkpoint import Checkpointer
from tests.run.test_checkpoint_integrity import METADATA, make_copy, make_iterator, make_state


class Killed(BaseException):
    """The process ending where it is (a kill -9), as the tests simulate it."""


def test_replaced_metadata_is_old_or_new_at_every_instant_and_keeps_the_arrays(tmp_path, monkeypatch):
    state, iterator = make_state(3), make_iterator()
    for _ in range(5):
        next(iterator)
    checkpointer = Checkpointer(tmp_path, keep=None)
    sums = {"loss_sum": 8.5, "nll_sum": 8.0, "correct": 3.0, "weight": 12.0, "grad_norm": 1.5}
    window = {"steps": 4, "last_step": 34, "sums": sums, "learning_rate": 0.1, "seconds": 0.4}
    checkpointer.save(34, state, iterator, METADATA.replace(step=34, interim=True, train_window=window))
    checkpointer.wait()
    last = METADATA.replace(step=34, train_seconds=12.5)

    def killed_before_the_rename(source, target):
        os.link(source, f"{source}.left-by-the-kill")  # what a kill -9 leaves: its temporary file
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", killed_before_the_rename)
        with pytest.raises(Killed):
            checkpointer.replace_metadata(34, last)
    assert checkpointer.read_metadata(34) == METADATA.replace(step=34, interim=True, train_window=window)

    checkpointer.replace_metadata(34, last)
    assert checkpointer.read_metadata(34) == last and not last.interim
    fresh = make_iterator()
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), state)
    step, restored, metadata = checkpointer.restore_latest(abstract, fresh)  # every checksum verified
    assert step == 34 and metadata == last
    for ours, saved in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(saved))
    assert next(fresh)["x"].tolist() == next(make_copy(iterator))["x"].tolist()  # the same data position
    checkpointer.close()


def test_metadata_of_another_step_is_refused(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=None)
    checkpointer.save_params(20, {"w": np.zeros(2, np.float32)}, METADATA.replace(step=20))
    with pytest.raises(ValueError, match="saving step 20 with the metadata of step 21"):
        checkpointer.replace_metadata(20, METADATA.replace(step=21))
    assert checkpointer.read_metadata(20) == METADATA.replace(step=20)
    checkpointer.close()


def test_metadata_process_0_cannot_write_is_one_line_in_every_process(tmp_path, monkeypatch):
    """Refused (a read-only step folder): a traceback in process 0, and the others waited for it at a
    barrier until jax's timeout. Process 0 says it in one line, the others at once, quoting it."""
    from jaxformer.run import checkpoint as checkpoint_module
    from tests.run.test_set_aside_processes import ProcessesOfTwo

    checkpointer = Checkpointer(tmp_path, keep=None)
    checkpointer.save_params(20, {"w": np.zeros(2, np.float32)}, METADATA.replace(step=20))
    file = checkpointer.metadata_file(20)

    def refused(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(checkpoint_module, "write_text_atomically", refused)
    processes = ProcessesOfTwo(monkeypatch)
    error = f"PermissionError: [Errno 13] Permission denied: '{file}'"
    told = f"process 0 could not write the metadata of checkpoint 20 in {tmp_path} ({error})"
    for index, line in enumerate([f"cannot save checkpoint 20 in {tmp_path}: {error}", told]):
        processes.be(index)
        with pytest.raises(UserError) as raised:
            checkpointer.replace_metadata(20, METADATA.replace(step=20, train_seconds=1.0))
        assert str(raised.value) == line
    monkeypatch.undo()
    assert checkpointer.read_metadata(20) == METADATA.replace(step=20)
    checkpointer.close()
