"""A signal at a training run's end: at its last step (its checkpoint saved, the final choice
left to the same command), during the final choice (no final/ left behind), as the choice is saved
or at the last step of a run without one (the run complete, exit 0), and once a finished run's
summary is printed (exit 0). In-process 4-step runs (_four_step_config, from test_signals.py) and
one train.py run."""

import json
import logging
import os
import signal
import subprocess
import time

import pytest

from tests.training.test_signals import _four_step_config, _signal_after_step, _time_budget_spent_at_step_1


@pytest.mark.parametrize(
    "when",
    # the others (about 18 s each) in the slow set: the default suite is near its 10-minute limit
    [
        "last step",
        pytest.param("last checkpoint closing", marks=pytest.mark.slow),
        pytest.param("time budget's last step", marks=pytest.mark.slow),
    ],
)
def test_a_signal_at_the_last_step_stops_before_the_final_choice(data_dir, tmp_path, monkeypatch, caplog, when):
    """The last step's checkpoint is saved as scheduled; the final choice (minutes of decoding) is
    left to the same command, which makes it, instead of the signal being ignored."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.training import loop

    config = _four_step_config(data_dir, final_choice=True)
    workdir = tmp_path / "run"
    real_run_due = loop.run_due
    real_close, sent = Checkpointer.close, []

    def signal_while_closing(checkpointer):  # while the last checkpoint's write is waited for
        if not sent and checkpointer.directory == workdir / "checkpoints":
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        real_close(checkpointer)

    last_step = 1 if when == "time budget's last step" else 4
    if when == "last checkpoint closing":
        monkeypatch.setattr(Checkpointer, "close", signal_while_closing)
    else:
        monkeypatch.setattr(loop, "run_due", _signal_after_step(loop))
    if last_step == 1:
        _time_budget_spent_at_step_1(config)
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(config, workdir)
    assert last["stopped_by_signal"] == signal.SIGTERM and "final" not in last and last["step"] == last_step
    assert (
        f"stopped by SIGTERM after the last step, {last_step} (its checkpoint is saved), before the final choice; "
        "exiting with 143; the same command makes the choice"
    ) in caplog.text
    assert not (workdir / "final").exists()
    monkeypatch.setattr(loop, "run_due", real_run_due)
    monkeypatch.setattr(Checkpointer, "close", real_close)
    again = loop.train_and_evaluate(config, workdir)  # the same command: no step, the choice
    assert (
        "stopped_by_signal" not in again and again["final"]["chosen"] and (workdir / "final" / str(last_step)).is_dir()
    )
    assert again["step"] == last_step


@pytest.mark.slow  # a training run and its final choice: the default suite is near its limit
def test_a_signal_during_the_final_choice_leaves_no_final_directory(data_dir, tmp_path, monkeypatch, caplog):
    """Stopped before the choice saved anything, the run leaves no empty final/ behind (one that
    reads as a choice made and lost); the same command then makes the choice."""
    from jaxformer.training import loop
    from jaxformer.training.validation_bleu import ValidationSet

    config = _four_step_config(data_dir, final_choice=True)
    workdir = tmp_path / "run"
    real_score = ValidationSet.score

    def signal_while_scoring(validation, params):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_score(validation, params)

    monkeypatch.setattr(ValidationSet, "score", signal_while_scoring)
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(config, workdir)
    assert last["stopped_by_signal"] == signal.SIGTERM and "final" not in last and last["step"] == 4
    assert "stopped by SIGTERM during the final choice at step 4" in caplog.text
    assert not (workdir / "final").exists()
    monkeypatch.setattr(ValidationSet, "score", real_score)
    again = loop.train_and_evaluate(config, workdir)
    assert "stopped_by_signal" not in again and (workdir / "final" / "4").is_dir()


@pytest.mark.slow  # a training run and its final choice: the default suite is near its limit
def test_a_signal_as_the_final_choice_is_saved_leaves_the_run_complete(data_dir, tmp_path, monkeypatch, caplog):
    """Held while orbax wrote final/, the signal was raised once the choice was saved, and the run
    then said it stopped before the choice and exited 143; it is complete, and says so."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.training import loop

    config = _four_step_config(data_dir, final_choice=True)
    workdir = tmp_path / "run"
    real_close = Checkpointer.close

    def signal_once_final_is_written(checkpointer):
        real_close(checkpointer)
        if checkpointer.directory == workdir / "final" and not checkpointer.read_only:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Checkpointer, "close", signal_once_final_is_written)
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(config, workdir)
    assert "stopped_by_signal" not in last and last["final"]["chosen"] and (workdir / "final" / "4").is_dir()
    assert last["signal_once_complete"] == signal.SIGTERM  # a sweep stops before its next variant
    assert "SIGTERM received as the final choice at step 4 ended: it is saved, the run is complete" in caplog.text
    assert "stopped by SIGTERM" not in caplog.text


@pytest.mark.slow  # a training run and its final choice: the default suite is near its limit
@pytest.mark.parametrize("ended_by", ["num_train_steps", "time budget"])
def test_a_signal_at_the_last_step_of_a_run_without_a_final_choice_says_it_is_complete(
    data_dir, tmp_path, monkeypatch, caplog, ended_by
):
    """Nothing is left to stop: the run ends as finished (exit 0), and its log says so after the
    handler's 'stopping once the step under way ... are done'; at a time budget's last step as at
    num_train_steps (the same command would train nothing)."""
    from jaxformer.training import loop

    config = _four_step_config(data_dir, final_choice=False)
    last_step = 1 if ended_by == "time budget" else 4
    if ended_by == "time budget":
        _time_budget_spent_at_step_1(config)
    monkeypatch.setattr(loop, "run_due", _signal_after_step(loop))
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(config, tmp_path / "run")
    assert "stopped_by_signal" not in last and last["step"] == last_step
    assert (
        f"SIGTERM received at the last step, {last_step}, which is done and saved: the run is complete, nothing is "
        "left to stop; exiting with 0"
    ) in caplog.text
    assert "resume with the same command" not in caplog.text


@pytest.mark.slow  # a short training run (about 20 s); the launcher's part: tests/commands/test_launch.py
def test_a_sigterm_after_the_run_finished_exits_0_with_the_run_complete(data_dir, tmp_path):
    """Sent once the summary is printed, while Python exits (jax's clean-up): the run is saved and
    its exit code stays 0, as `python -m` too (it had died of the signal, 143, for a finished run)."""
    from jaxformer.run.loading import load_checkpoint
    from tests.training.test_loop import ONE_LAYER, command, environment, losses

    workdir = tmp_path / "finished"
    train = command(workdir, data_dir, *ONE_LAYER, "--config.training.num_train_steps=4")
    train[1:2] = ["-m", "jaxformer.commands.train"]
    process = subprocess.Popen(train, env=environment(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = []
    while not (said and said[-1].startswith("  translate: ")):  # the summary's last line
        said.append(process.stderr.readline())
        assert said[-1], "".join(said)[-3000:]
    time.sleep(0.1)  # past the command's return: in Python's exit
    process.send_signal(signal.SIGTERM)
    error = "".join(said) + process.communicate(timeout=60)[1]
    assert process.returncode == 0 and "Traceback" not in error, error[-3000:]
    assert sorted(losses(workdir)) == [1, 2, 3, 4] and not (workdir / "lock").exists()
    assert (workdir / "checkpoints" / "4" / "commit_success.txt").is_file()
    assert load_checkpoint(workdir, 4)[0] == 4  # complete: it restores, checksums verified
    assert json.loads((workdir / "last_metrics.json").read_text())["step"] == 4
