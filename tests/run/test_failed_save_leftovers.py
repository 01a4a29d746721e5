"""A save that failed in one of its items (its metadata file refused) while orbax's background
threads of its other items still ran: each logged its own end after the command's one-line error
(measured with two processes: "_SignalingThread.run() raised an exception: cannot schedule new
futures after shutdown"). They are cancelled where the failure is raised: the error is the last line."""

import asyncio
import logging
import threading
import time

import pytest

from jaxformer.errors import UserError
from jaxformer.run.checkpoint import Checkpointer
from tests.run.test_checkpoint_integrity import METADATA, make_iterator, make_state


def test_the_failed_saves_other_writes_log_nothing_after_its_error(tmp_path, monkeypatch, caplog):
    from orbax.checkpoint._src.futures import future as orbax_future
    from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler, json_checkpoint_handler

    json_handler, pytree_handler = json_checkpoint_handler.JsonCheckpointHandler, base_pytree_checkpoint_handler
    json_save, write_metadata = (
        json_handler._save_fn,
        pytree_handler.BasePyTreeCheckpointHandler._write_metadata_after_commits,
    )

    async def refused(self, value, directory):
        if "/2.orbax" in str(directory):
            raise PermissionError(13, "Permission denied", str(directory / "metadata"))
        return await json_save(self, value, directory)

    async def late(self, *args, **kwargs):  # the arrays' writer, ending after the metadata was refused
        await asyncio.sleep(1.0)
        raise OSError("the arrays' writer ended after the error")

    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    checkpointer.save(1, make_state(1), make_iterator(), METADATA.replace(step=1))
    checkpointer.wait()
    monkeypatch.setattr(json_handler, "_save_fn", refused)
    monkeypatch.setattr(pytree_handler.BasePyTreeCheckpointHandler, "_write_metadata_after_commits", late)
    caplog.set_level(logging.INFO)
    with pytest.raises(UserError, match="^cannot save checkpoint 2 in .*: PermissionError: "):
        checkpointer.save(2, make_state(2), make_iterator(), METADATA.replace(step=2))
        checkpointer.wait()
    raised = time.time()
    for thread in threading.enumerate():  # the writes left over: ended (cancelled) or ending
        if isinstance(thread, orbax_future._SignalingThread):
            threading.Thread.join(thread, timeout=10)
    after = [(record.levelname, record.getMessage()) for record in caplog.records if record.created >= raised]
    assert [(level, message) for level, message in after if level in ("WARNING", "ERROR", "CRITICAL")] == []
    monkeypatch.setattr(json_handler, "_save_fn", json_save)
    monkeypatch.setattr(pytree_handler.BasePyTreeCheckpointHandler, "_write_metadata_after_commits", write_metadata)
    checkpointer.save(3, make_state(3), make_iterator(), METADATA.replace(step=3))  # the next save is unharmed
    checkpointer.wait()
    assert checkpointer.steps() == [1, 3]
    checkpointer.close()


def test_an_orbax_without_its_signaling_thread_class_leaves_the_failure_one_line(monkeypatch):
    """_SignalingThread is private to orbax: where a later orbax has none, the cancelling step
    does nothing, so the save's failure is still the one-line error and not an AttributeError."""
    from orbax.checkpoint._src.futures import future as orbax_future

    from jaxformer.run import save_barrier

    monkeypatch.delattr(orbax_future, "_SignalingThread")
    save_barrier._cancel_leftover_writes()  # raised AttributeError before it was guarded
