"""End-to-end runs of train.py on the tiny config stopped by SIGTERM, as a scheduler stops them:
the checkpoint saved and exit 143, and resumed, the checkpoints, metrics.jsonl and TensorBoard
records of a run never stopped, whether it stopped between checkpoints or between log steps. The
signal handler itself: test_signals.py."""

import json
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxformer.run.loading import load_checkpoint
from tests.training.test_loop import (
    ONE_LAYER,
    SIGTERM_AFTER_STEP,
    checkpoint_steps,
    command,
    environment,
    losses,
    train,
)


@pytest.mark.slow  # a run stopped by a signal; the handler is unit-tested in test_signals.py
def test_sigterm_saves_stops_and_exits_143(data_dir, tmp_path):
    stop_signal = signal.SIGTERM  # Ctrl-C (SIGINT) takes the same path: tests/training/test_signals.py
    workdir = tmp_path / "terminated"
    process = subprocess.Popen(
        command(
            workdir,
            data_dir,
            "--config.training.num_train_steps=100000",
            "--config.training.checkpoint_every_steps=100000",
        ),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not (workdir / "metrics.jsonl").exists() or len(losses(workdir)) < 5:
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + stop_signal, stderr[-3000:]  # a scheduler requeues it; 0 means finished
    assert f"stopped by {stop_signal.name}" in stderr
    last_step = max(losses(workdir))
    assert checkpoint_steps(workdir) == [last_step]
    assert not (workdir / "lock").exists()  # released


@pytest.mark.slow  # two runs, one stopped by a signal between its scheduled checkpoints, then resumed
def test_a_run_stopped_between_checkpoints_ends_with_the_checkpoints_of_one_never_stopped(data_dir, tmp_path):
    """The checkpoint a signal saves is interim: it pushes no older checkpoint out, and the
    resumed run's next checkpoint deletes it, so the last `keep` (and their average) are the same."""
    flags = (
        "--config.training.num_train_steps=200",
        "--config.training.checkpoint_every_steps=50",
        "--config.training.keep_checkpoints=2",
        *ONE_LAYER,
    )
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(straight, data_dir, *flags)
    process = subprocess.Popen(
        command(stopped, data_dir, *flags),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not (stopped / "metrics.jsonl").exists() or max(losses(stopped), default=0) < 105:
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    (interim,) = [step for step in checkpoint_steps(stopped) if step % 50]
    assert 100 < interim < 150 and checkpoint_steps(stopped) == [50, 100, interim]  # keep=2: 50 not pushed out
    result = train(stopped, data_dir, *flags)
    assert f"removing the interim checkpoint {interim}" in result.stderr
    assert checkpoint_steps(stopped) == checkpoint_steps(straight) == [150, 200]
    assert losses(stopped) == losses(straight)
    for step in (150, 200):
        _, _, ours = load_checkpoint(stopped, step)
        _, _, theirs = load_checkpoint(straight, step)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True))


@pytest.mark.slow  # three runs: one never stopped, one stopped by a signal between log steps and then resumed
def test_a_run_stopped_between_log_steps_writes_the_records_of_one_never_stopped(data_dir, tmp_path):
    """The steps since the last train/ record are stored with the interim checkpoint, not written
    as a record of their own: the resumed run's record at the next log step covers the whole
    interval, so metrics.jsonl and TensorBoard hold the figures of a run never stopped."""
    from tests.training.test_tensorboard import read_events, scalars_of

    flags = ("--config.training.log_every_steps=10", *ONE_LAYER)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(straight, data_dir, *flags)
    argv = command(stopped, data_dir, *flags)[2:]  # after the interpreter and train.py
    result = subprocess.run(
        [sys.executable, "-c", SIGTERM_AFTER_STEP, "34", *argv],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 143, result.stderr[-3000:]
    assert "stopped by SIGTERM at step 34; checkpoint saved" in result.stderr
    assert checkpoint_steps(stopped) == [20, 34] and max(losses(stopped)) == 30  # no record of steps 31-34
    assert "resumed from step 34 of" in train(stopped, data_dir, *flags).stderr

    def train_figures(workdir):
        timed = ("time", "train/tokens_per_second", "train/steps_per_second")
        lines = (workdir / "metrics.jsonl").read_text().splitlines()
        records = [{key: value for key, value in json.loads(line).items() if key not in timed} for line in lines]
        events = [s for path in sorted((workdir / "tensorboard").iterdir()) for s in scalars_of(read_events(path))]
        return records, sorted(event for event in events if event[1] not in timed)

    assert train_figures(stopped) == train_figures(straight)
    assert sorted(losses(stopped)) == [10, 20, 30, 40]
