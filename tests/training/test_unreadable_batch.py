"""A training batch that cannot be read: the steps done are saved before the run stops with the
data's error, and a save that fails is said, not raised over it. The whole run: the slow
tests/training/test_loop.py::test_data_damaged_while_training_stops_with_its_steps_saved_and_resumes_exactly."""

import logging

import pytest

from jaxformer.data.parallel_text import DataError
from jaxformer.training.unreadable_batch import saved_before_stopping

DAMAGED = DataError("the prepared multi30k data in /d is damaged: /d/f cannot be read (x); remove /d so that ...")


def test_the_steps_done_are_saved_and_the_error_says_so():
    saved = []
    error = saved_before_stopping(DAMAGED, 37, 20, saved.append)
    assert saved == [37]
    assert isinstance(error, DataError) and "\n" not in str(error)
    assert (
        str(error) == f"{DAMAGED}; training stopped after step 37, which is saved: the same command then resumes there"
    )


def test_a_save_that_fails_does_not_hide_the_data_error(caplog):
    def save(step):
        raise OSError(28, "No space left on device")

    with caplog.at_level(logging.WARNING):
        error = saved_before_stopping(DAMAGED, 37, 20, save)
    assert isinstance(error, DataError)
    assert str(error) == (
        f"{DAMAGED}; training stopped after step 37, whose checkpoint could not be saved "
        "(OSError: [Errno 28] No space left on device); the same command then resumes from the last checkpoint"
    )
    assert "the checkpoint of step 37 could not be saved: OSError: [Errno 28] No space left on device" in caplog.text


def test_without_a_step_since_the_start_nothing_is_saved():
    saved = []
    assert saved_before_stopping(DAMAGED, 20, 20, saved.append) is DAMAGED and not saved


class DamagedMidRun:
    """The training split, whose reads raise the DataError of a damaged file once `damaged` is set."""

    def __init__(self, source):
        self.source, self.damaged = source, False

    def __len__(self):
        return len(self.source)

    def __getitem__(self, key):
        if self.damaged:
            raise DAMAGED
        return self.source[key]


@pytest.mark.slow  # a training run (about 10 s on a CPU); the message is tested above
def test_a_run_whose_save_fails_stops_with_the_data_error(data_dir, tmp_path, monkeypatch, caplog):
    """The save's error comes again when the run closes its checkpointer (orbax raises a failed
    write's error at every wait): the data's error is still the one raised."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.training import loop, run_batches
    from tests.training.test_signals import _four_step_config

    sources = []
    real_train_dataset, real_run_due = run_batches.train_dataset, loop.run_due

    def train_dataset(source, *args, **kwargs):
        sources.append(DamagedMidRun(source))
        return real_train_dataset(sources[-1], *args, **kwargs)

    def damage_after_step_3(periodic, step, end):
        real_run_due(periodic, step, end)
        if step == 3:
            sources[0].damaged = True

    def disk_full(checkpointer):
        if checkpointer.directory == tmp_path / "run" / "checkpoints" and sources[0].damaged:
            raise OSError(28, "No space left on device")

    real_close = Checkpointer.close
    monkeypatch.setattr(run_batches, "train_dataset", train_dataset)
    monkeypatch.setattr(loop, "run_due", damage_after_step_3)
    monkeypatch.setattr(Checkpointer, "wait", disk_full)
    monkeypatch.setattr(Checkpointer, "close", lambda checkpointer: (disk_full(checkpointer), real_close(checkpointer)))
    config = _four_step_config(data_dir, final_choice=False)
    config.training.eval_every_steps = 4  # not reached: nothing evaluated, nor compiled for it
    with caplog.at_level(logging.WARNING), pytest.raises(DataError) as raised:
        loop.train_and_evaluate(config, tmp_path / "run")
    assert str(raised.value) == (
        f"{DAMAGED}; training stopped after step 3, whose checkpoint could not be saved "
        "(OSError: [Errno 28] No space left on device); the same command then resumes from the last checkpoint"
    )
    assert "the checkpoint of step 3 could not be saved: OSError: [Errno 28] No space left on device" in caplog.text
