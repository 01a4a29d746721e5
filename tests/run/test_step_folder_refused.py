"""A checkpoint whose step folder cannot be made (a checkpoints folder made read-only): one line at
the save, and the next save unharmed."""

import time

import pytest

from jaxformer.errors import UserError
from jaxformer.run.checkpoint import Checkpointer
from tests.run.test_checkpoint_integrity import METADATA, make_iterator, make_state


def test_a_step_folder_that_cannot_be_made_is_one_line_at_the_save(tmp_path, monkeypatch):
    """orbax made the step folder in a background thread, which kept its error: a run whose
    checkpoints folder was made read-only waited 5 minutes for that folder's signal, then ended with
    a traceback. The folder is made in the save itself now, and its refusal is one line there."""
    from orbax.checkpoint._src.path import async_path

    original = async_path.mkdir

    async def refused_mkdir(path, *args, **kwargs):
        if ".orbax-checkpoint-tmp" in path.name:
            raise PermissionError(13, "Permission denied", str(path))
        return await original(path, *args, **kwargs)

    monkeypatch.setattr(async_path, "mkdir", refused_mkdir)
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    started = time.monotonic()
    with pytest.raises(UserError) as raised:
        checkpointer.save(1, make_state(1), make_iterator(), METADATA.replace(step=1))
        checkpointer.wait()
    assert time.monotonic() - started < 60
    folder = directory / "1.orbax-checkpoint-tmp"
    assert str(raised.value) == (
        f"cannot save checkpoint 1 in {directory}: PermissionError: [Errno 13] Permission denied: '{folder}'"
    )
    monkeypatch.setattr(async_path, "mkdir", original)
    checkpointer.save(2, make_state(2), make_iterator(), METADATA.replace(step=2))  # the next save is not stuck
    checkpointer.wait()
    assert checkpointer.steps() == [2]
    checkpointer.close()


def test_a_step_folder_that_cannot_be_renamed_is_one_line_where_the_save_is_waited_for(tmp_path, monkeypatch):
    """orbax's last act of a save, in its background thread, renames the written step folder to its
    step (refused: a checkpoints folder made read-only meanwhile); the wait for the save raised that
    PermissionError, a traceback (exit 1). It is one line now, and the checkpoint before is kept."""
    from orbax.checkpoint._src.path import async_path

    original = async_path.rename

    async def refused_rename(source, target, *args, **kwargs):
        if target.name == "2":
            raise PermissionError(13, "Permission denied", str(source))
        return await original(source, target, *args, **kwargs)

    monkeypatch.setattr(async_path, "rename", refused_rename)
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    checkpointer.save(1, make_state(1), make_iterator(), METADATA.replace(step=1))
    checkpointer.save(2, make_state(2), make_iterator(), METADATA.replace(step=2))
    with pytest.raises(UserError) as raised:
        checkpointer.wait()
    folder = directory / "2.orbax-checkpoint-tmp"
    assert str(raised.value) == (
        f"cannot save checkpoint 2 in {directory}: PermissionError: [Errno 13] Permission denied: '{folder}'"
    )
    assert Checkpointer(directory, read_only=True).steps() == [1]
