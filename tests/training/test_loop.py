"""End-to-end runs of train.py on the tiny config: resume, damaged checkpoints and data, NaN, and the
helpers other files run train.py with. Runs stopped by SIGTERM: test_signal_stopped_runs.py."""

import gzip
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxformer.commands import train as train_command
from jaxformer.errors import EXIT_USER_ERROR
from jaxformer.run.checksums import _metadata_digest
from jaxformer.run.loading import load_checkpoint
from tests.xla_flags import xla_flags

pytestmark = pytest.mark.xdist_group("train-loop")

ROOT = pathlib.Path(__file__).parents[2]
STEPS = 40  # checkpoints at 20 and 40 (jaxformer/configs/tiny.py)
# One layer per stack, for runs whose checks hold for any depth: every parameter kind is in
# layer_0, and each program compiles in about two thirds of the tiny preset's time
# (docs/test_suite.md).
ONE_LAYER = ("--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1")


def command(workdir, data_dir, *overrides):
    """train.py on the tiny config, or on the config an override names (`--config=PATH`)."""
    named = any(flag == "--config" or flag.startswith("--config=") for flag in overrides)
    return [
        sys.executable,
        str(ROOT / "train.py"),
        *([] if named else ["--config", str(ROOT / "jaxformer" / "configs" / "tiny.py")]),
        "--workdir",
        str(workdir),
        f"--config.data.data_dir={data_dir}",
        *overrides,
    ]


def environment():
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags()  # one device
    env["JAX_PLATFORMS"] = "cpu"
    return env


def train(workdir, data_dir, *overrides, check=True):
    result = subprocess.run(
        command(workdir, data_dir, *overrides), env=environment(), capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(f"train.py failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def losses(workdir, prefix="train/loss"):
    """{step: value} from metrics.jsonl; a step logged twice (before a crash, after resuming) keeps the later one."""
    values = {}
    for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if prefix in record:
            values[record["step"]] = record[prefix]
    return values


def checkpoint_steps(workdir):
    directory = pathlib.Path(workdir) / "checkpoints"
    return sorted(int(path.name) for path in directory.iterdir() if path.name.isdigit())


# The straight run and every run of this file set against it: one layer per stack, as its checks
# (resume, refusals, damage) hold for any depth, and each of its programs compiles faster.
STRAIGHT = ONE_LAYER
# Validation BLEU does not touch the training state: the resumed runs below, without it, match.
STRAIGHT_BLEU = (
    *STRAIGHT,
    "--config.training.bleu_every_steps=20",
    "--config.training.bleu_examples=16",
    "--config.decoding.max_extra_length=8",
)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, data_dir):
    workdir = tmp_path_factory.mktemp("straight")
    train(workdir, data_dir, *STRAIGHT_BLEU)
    return workdir


def test_straight_run_trains(straight_run):
    train_losses = losses(straight_run)
    assert sorted(train_losses) == list(range(1, STEPS + 1))
    assert train_losses[STEPS] < train_losses[1] - 1.0  # it learns
    assert set(losses(straight_run, "eval/perplexity")) == {20, 40}
    bleu = losses(straight_run, "eval/bleu")
    assert set(bleu) == {20, 40} and all(0.0 <= value <= 100.0 for value in bleu.values())
    best = json.loads((straight_run / "last_metrics.json").read_text())["bleu"]["best_bleu"]
    assert best == max(bleu.values())
    best_steps = [int(path.name) for path in (straight_run / "best").iterdir() if path.name.isdigit()]
    assert best_steps == [max(bleu, key=lambda step: (bleu[step], -step))]  # the first step with the best BLEU
    assert checkpoint_steps(straight_run) == [20, 40]
    from jaxformer.run.loading import load_checkpoint  # each says whether it was saved as the run's last

    assert [load_checkpoint(straight_run, step, params=False)[1].saved_as_last for step in (20, 40)] == [False, True]
    assert (straight_run / "tokenizer.model").exists()
    assert any((straight_run / "tensorboard").iterdir())


def killed_at_step_20_and_resumed(workdir, data_dir, *overrides):
    """Runs train.py, kills it (SIGKILL) once step 20's checkpoint is committed, then runs it again to the end."""
    process = subprocess.Popen(
        command(workdir, data_dir, *overrides), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 300
    while not (workdir / "checkpoints" / "20" / "commit_success.txt").exists():
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "no checkpoint at step 20"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert max(losses(workdir)) < STEPS, "the run finished before it could be killed"
    return train(workdir, data_dir, *overrides)


def test_exact_resume_after_sigkill(straight_run, data_dir, tmp_path):
    workdir = tmp_path / "killed"
    resumed = killed_at_step_20_and_resumed(workdir, data_dir, *STRAIGHT)
    # Its validation line counts the training pairs this process read: since it resumed.
    assert re.search(
        r"step 40: validation loss .*; the length filter dropped \d+ of the [\d,]+ training pairs "
        r"read since it resumed at step 20\n",
        resumed.stderr,
    ), resumed.stderr[-3000:]
    assert losses(workdir) == losses(straight_run)  # bitwise: every step's loss, same data order
    assert losses(workdir, "eval/loss") == losses(straight_run, "eval/loss")
    from jaxformer.run.loading import load_checkpoint  # ... and the parameters it ends with, bit for bit

    (_, _, resumed), (_, _, straight) = (load_checkpoint(run, STEPS) for run in (workdir, straight_run))
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_run_killed_after_its_last_checkpoint_ends_as_one_never_stopped(straight_run, data_dir, tmp_path, capsys):
    """Killed (kill -9) once its last checkpoint was written, before orbax removed the oldest one
    beyond training.keep_checkpoints and before last_metrics.json: the same command trains no step,
    and ends with the checkpoints and the last figures (and summary) of a run never stopped."""
    workdir = tmp_path / "killed"
    shutil.copytree(straight_run, workdir)
    (workdir / "last_metrics.json").unlink()
    lowered = command(workdir, data_dir, *STRAIGHT_BLEU, "--config.training.keep_checkpoints=1")
    assert train_command.main(lowered[2:]) == EXIT_USER_ERROR  # a resume lowering the run's keep of 3 itself
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: training.keep_checkpoints=1, lowered from the run's 3: its end (it trains no ")
    assert error.endswith(" to keep fewer") and checkpoint_steps(workdir) == [20, STEPS]  # one line; 20 kept
    # A run keeping 1 checkpoint, as checkpoint 40's config now says: 20 is the one orbax had not
    # removed yet.
    metadata_file = workdir / "checkpoints" / str(STEPS) / "metadata" / "metadata"
    written = json.loads(metadata_file.read_text())
    written["config"]["training"]["keep_checkpoints"] = 1
    written["checksums"]["metadata"] = _metadata_digest(written)
    metadata_file.write_text(json.dumps(written))
    result = train(workdir, data_dir, *STRAIGHT_BLEU, "--config.training.keep_checkpoints=1")
    assert "resumed from step 40" in result.stderr and checkpoint_steps(workdir) == [STEPS]
    straight, resumed = (json.loads((run / "last_metrics.json").read_text()) for run in (straight_run, workdir))
    assert sorted(resumed) == sorted(straight) == ["bleu", "eval", "first_step", "step", "train", "train_seconds"]
    assert [resumed[key] for key in ("eval", "bleu", "train", "step")] == [
        straight[key] for key in ("eval", "bleu", "train", "step")
    ]
    validation = f"loss {straight['eval']['loss']:.4f}, perplexity {straight['eval']['perplexity']:.2f}"
    assert f"validation: {validation}\n" in result.stderr
    assert f"checkpoints: latest {workdir / 'checkpoints'} (step {STEPS});" in result.stderr


@pytest.mark.slow  # two more runs; the stream's exact restore is unit-tested in tests/data/test_subword_sampling.py
def test_subword_sampling_trains_other_segmentations_and_resumes_exactly(straight_run, data_dir, tmp_path):
    sampling = ("--config.tokenizer.sampling_nbest=8", "--config.tokenizer.sampling_alpha=0.1")
    straight, killed = tmp_path / "sampled", tmp_path / "sampled_killed"
    train(straight, data_dir, *STRAIGHT, *sampling)
    sampled_losses = losses(straight)
    assert sorted(sampled_losses) == list(range(1, STEPS + 1))
    assert sampled_losses != losses(straight_run)  # other segmentations of the same pairs
    killed_at_step_20_and_resumed(killed, data_dir, *STRAIGHT, *sampling)
    assert losses(killed) == sampled_losses  # bitwise: the resumed run drew the same segmentations
    assert losses(killed, "eval/loss") == losses(straight, "eval/loss")


@pytest.mark.slow  # a second run; the fallback is unit-tested in tests/run/test_checkpoint_fallback.py
def test_damaged_latest_checkpoint_falls_back_to_the_previous(straight_run, data_dir, tmp_path):
    workdir = tmp_path / "damaged"
    shutil.copytree(straight_run, workdir)
    (workdir / "metrics.jsonl").write_text("")
    damaged = 0
    for path in (workdir / "checkpoints" / "40" / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
            damaged += 1
    assert damaged
    result = train(workdir, data_dir, *STRAIGHT)
    assert "checkpoint" in result.stderr and "cannot be restored" in result.stderr
    assert "resumed from step 20" in result.stderr
    straight = losses(straight_run)
    assert losses(workdir) == {step: straight[step] for step in range(21, STEPS + 1)}


# train.py (its arguments after argv[1]) whose prepared training file (under the data_dir argv[1])
# gets the middle half of its bytes zeroed once step 25 is done, as a disk or another program might.
DAMAGED_AFTER_STEP_25 = """
import pathlib, sys
from jaxformer.commands import train
from jaxformer.training import loop

real_run_due = loop.run_due

def damage_after_step_25(periodic, step, end):
    real_run_due(periodic, step, end)
    if step == 25:
        (path,) = pathlib.Path(sys.argv[1]).rglob("multi30k-train.array_record-*")
        size = path.stat().st_size
        with path.open("r+b") as file:  # in place: the run's open reader sees it
            file.seek(size // 4)
            file.write(bytes(size // 2))

loop.run_due = damage_after_step_25
sys.exit(train.main(sys.argv[2:]))
"""


@pytest.mark.slow  # two runs; the pieces are unit-tested (tests/data/test_pipeline.py, test_unreadable_batch.py)
def test_data_damaged_while_training_stops_with_its_steps_saved_and_resumes_exactly(straight_run, data_dir, tmp_path):
    """The steps since the last checkpoint are saved (an interim checkpoint) before the one-line
    error; once the data is prepared again, the same command resumes there: the losses and the
    parameters of a run never stopped, and its checkpoints."""
    tfds_dir, workdir = tmp_path / "tfds", tmp_path / "damaged"
    shutil.copytree(data_dir, tfds_dir)
    argv = command(workdir, tfds_dir, *STRAIGHT)[2:]  # after the interpreter and train.py
    result = subprocess.run(
        [sys.executable, "-c", DAMAGED_AFTER_STEP_25, str(tfds_dir), *argv],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    stopped = max(losses(workdir))
    assert 25 <= stopped < STEPS and checkpoint_steps(workdir) == [20, stopped]
    (train_file,) = tfds_dir.rglob("multi30k-train.array_record-*")
    prepared = train_file.parent
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(
        f"error: the prepared multi30k data in {prepared} is damaged: {train_file} cannot be read ("
    )
    assert error.endswith(
        f"; remove {prepared} so that it is prepared again; training stopped after step {stopped}, which is saved: "
        "the same command then resumes there"
    )
    shutil.rmtree(prepared)  # as the error says
    resumed = train(workdir, tfds_dir, *STRAIGHT)
    assert f"resumed from step {stopped} of" in resumed.stderr
    assert checkpoint_steps(workdir) == [20, STEPS]  # the interim one removed by the next
    assert losses(workdir) == losses(straight_run)  # bitwise: every step's loss, same data order
    assert losses(workdir, "eval/loss") == losses(straight_run, "eval/loss")
    (_, _, ours), (_, _, theirs) = (load_checkpoint(run, STEPS) for run in (workdir, straight_run))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # a second run; the finiteness check is unit-tested
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(straight_run, data_dir, tmp_path):
    workdir = tmp_path / "diverged"
    shutil.copytree(straight_run, workdir)
    result = train(
        workdir,
        data_dir,
        *STRAIGHT,
        "--config.training.num_train_steps=60",
        "--config.optimizer.learning_rate_scale=1e30",
        check=False,
    )
    assert result.returncode == 2
    assert "error: training loss is nan" in result.stderr and "stopping without saving" in result.stderr
    assert "the last good checkpoint is step 40" in result.stderr
    assert checkpoint_steps(workdir) == [20, 40]


def test_a_workdir_of_another_config_is_an_error(straight_run, data_dir, tmp_path):
    workdir = tmp_path / "other"
    shutil.copytree(straight_run, workdir)
    result = train(workdir, data_dir, *STRAIGHT, "--config.model.num_heads=2", check=False)
    assert result.returncode != 0
    assert "holds a run with another configuration" in result.stderr and "model.num_heads" in result.stderr


def test_unknown_override_lists_near_matches(data_dir, tmp_path):
    result = train(tmp_path / "typo", data_dir, "--config.training.num_train_step=5", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown config key 'training.num_train_step'; did you mean training.num_train_steps, "
        "training.bleu_every_steps, training.log_every_steps?"
    ]
    assert not (tmp_path / "typo").exists()  # nothing written


def test_resuming_on_other_data_files_is_an_error(straight_run, data_dir, tmp_path):
    workdir = tmp_path / "other-data"
    shutil.copytree(straight_run, workdir)
    raw = tmp_path / "raw"
    shutil.copytree(ROOT / "jaxformer" / "data" / "raw" / "multi30k", raw)
    with gzip.open(raw / "val.de.gz", "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    lines[0] = lines[0].upper()  # one edited line: other data, the same file names
    with gzip.open(raw / "val.de.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    prepared = sorted((pathlib.Path(data_dir) / "multi30k").iterdir())
    result = train(
        workdir,
        data_dir,
        *STRAIGHT,
        f"--config.data.raw_dir={raw}",
        "--config.training.num_train_steps=60",
        check=False,
    )
    assert result.returncode == 2
    assert f"error: {workdir} was trained on other data files (fingerprint sha256:" in result.stderr
    assert checkpoint_steps(workdir) == [20, 40]
    # Refused before the edited files were prepared: no new copy of the data under data_dir.
    assert sorted((pathlib.Path(data_dir) / "multi30k").iterdir()) == prepared
    assert "downloaded and prepared" not in result.stderr


# train.py (its arguments after argv[2]) sent SIGTERM once step argv[1] is done, as a scheduler might.
# Used by test_signal_stopped_runs.py and test_shortened_interim.py.
SIGTERM_AFTER_STEP = """
import os, signal, sys
from jaxformer.commands import train
from jaxformer.training import loop

real_run_due = loop.run_due

def stop_after(periodic, step, end):
    real_run_due(periodic, step, end)
    if step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGTERM)

loop.run_due = stop_after
sys.exit(train.main(sys.argv[2:]))
"""
