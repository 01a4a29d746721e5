"""A run stopped between its checkpoints (an interim checkpoint) and resumed with its length
shortened past that step ends there: that step's evaluation, and its interim checkpoint made the
run's last, which a kill at any point never leaves missing."""

import json
import subprocess
import sys

import pytest

from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_checkpoint
from tests.training.test_loop import ONE_LAYER, SIGTERM_AFTER_STEP, checkpoint_steps, command, environment, losses

pytestmark = pytest.mark.xdist_group("train-loop")

# train.py (its arguments after argv[2]) killed (SIGKILL) as checkpoint argv[1] changes: as it is
# saved again, or as its new metadata is renamed into place.
KILLED_AS_THE_CHECKPOINT_CHANGES = """
import os, signal, sys
from jaxformer.commands import train
from jaxformer.run.checkpoint import Checkpointer

step = int(sys.argv[1])
real_save, real_replace = Checkpointer.save, os.replace

def killed_saving(checkpointer, at, *args, **kwargs):
    if at == step:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(checkpointer, at, *args, **kwargs)

def killed_renaming(source, target):
    if str(target).endswith(f"/checkpoints/{step}/metadata/metadata"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(source, target)

Checkpointer.save, os.replace = killed_saving, killed_renaming
sys.exit(train.main(sys.argv[2:]))
"""


def run_script(script, *argv):
    return subprocess.run(
        [sys.executable, "-c", script, *argv], env=environment(), capture_output=True, text=True, timeout=600
    )


def interim(workdir, step):
    checkpointer = Checkpointer(workdir / "checkpoints", read_only=True)
    try:
        return checkpointer.read_metadata(step).interim
    finally:
        checkpointer.close()


@pytest.mark.slow  # three runs: stopped between checkpoints, then resumed shortened and killed, then again
def test_a_kill_as_a_shortened_run_ends_at_its_interim_checkpoint_loses_no_step(data_dir, tmp_path):
    workdir = tmp_path / "run"
    flags = ("--config.training.log_every_steps=10", *ONE_LAYER)  # steps 31-34: in the interim checkpoint
    argv = command(workdir, data_dir, *flags)[2:]  # after the interpreter and train.py
    stopped = run_script(SIGTERM_AFTER_STEP, "34", *argv)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert checkpoint_steps(workdir) == [20, 34] and interim(workdir, 34)

    shortened = (*argv, "--config.training.num_train_steps=30")
    killed = run_script(KILLED_AS_THE_CHECKPOINT_CHANGES, "34", *shortened)
    assert killed.returncode == -9, killed.stderr[-3000:]  # killed at the worst point, not finished
    assert checkpoint_steps(workdir) == [20, 34]  # the checkpoint of step 34 is still there, whole
    step, metadata, _ = load_checkpoint(workdir, 34)  # it restores, its checksums verified
    assert step == 34 and metadata.interim  # the kill came before its new metadata was in place

    result = subprocess.run(
        command(workdir, data_dir, *flags, "--config.training.num_train_steps=30"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from step 34 of" in result.stderr  # not from 20: no step trained is lost
    assert checkpoint_steps(workdir) == [20, 34] and not interim(workdir, 34)  # now the run's last
    step, metadata, _ = load_checkpoint(workdir, 34)
    assert step == 34 and metadata.train_window is None  # steps 31-34 written as their record, not kept
    assert 34 in losses(workdir, "eval/loss") and max(losses(workdir)) == 34  # its evaluation, its train record
    # Written again after the kill: the killed process's records of step 34 moved aside, each kept once.
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    kinds = [(record["step"], frozenset(record) - {"time"}) for record in records]
    assert len(kinds) == len(set(kinds))
    moved = (workdir / "metrics.rolled_back.jsonl").read_text().splitlines()
    assert {json.loads(line)["step"] for line in moved} == {34}
