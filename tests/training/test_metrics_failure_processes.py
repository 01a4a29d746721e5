"""A metrics write failing in process 0 of a two-process run (only process 0 writes metrics.jsonl
and TensorBoard): raised in process 0 alone, it left process 1 waiting in its next collective, and
process 0 for process 1 at its exit, until jax's 5-minute shutdown barrier aborted both (SIGABRT, no
line of the error in process 1). Both now stop at the next step they share, with one line each; or,
where process 0 cannot open its metrics files, before the first step; or, where it cannot write
last_metrics.json once the run's work is done, there."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training.test_distributed import COMMON, free_port
from tests.training.test_loop import command as train_command
from tests.xla_flags import xla_flags

# train.py, process 0's metrics failing as on a full disk: TensorBoard's `write` from step 25, its `open`
# (a resumed run's first act on its metrics files), or the write of `last` metrics (last_metrics.json).
FULL_DISK = textwrap.dedent(
    """
    import runpy, sys
    import jax
    from jaxformer.training import metrics, tensorboard

    failing = sys.argv.pop(1)
    events = tensorboard.ScalarEventWriter
    original_init, original_write = events.__init__, events.write

    def init(self, *args, **kwargs):
        if jax.process_index() == 0 and failing == "open":
            raise OSError(28, "No space left on device")
        original_init(self, *args, **kwargs)

    def write(self, step, scalars, wall_time=None):
        if jax.process_index() == 0 and failing == "write" and step >= 25:
            raise OSError(28, "No space left on device")
        original_write(self, step, scalars, wall_time)

    events.__init__, events.write = init, write
    original_atomic = metrics.write_text_atomically

    def write_atomically(path, text):  # "last": last_metrics.json, once the run's work is done
        if jax.process_index() == 0 and failing == "last" and path.name == "last_metrics.json":
            raise OSError(28, "No space left on device")
        original_atomic(path, text)

    metrics.write_text_atomically = write_atomically
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def two_processes(tmp_path, data_dir, failing, steps=100, wrapper=FULL_DISK, timeout=200):
    """Processes 0 and 1 of one run of `steps` steps, train.py run by `wrapper` (process 0's metrics
    `failing`): exit codes and stderrs, both killed after `timeout` seconds."""
    script = tmp_path / "full_disk.py"
    script.write_text(wrapper)
    flags = (*COMMON, f"--config.training.num_train_steps={steps}", "--config.training.eval_every_steps=1000")
    flags += (f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = xla_flags(1)
    command = [sys.executable, str(script), failing]
    started = [
        subprocess.Popen(
            [*command, *train_command(tmp_path / "run", data_dir, *flags, f"--process_id={index}")[1:]],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        for index in range(2)
    ]
    try:  # generous on a loaded machine; a process left waiting waits 5 minutes
        logs = [process.communicate(timeout=timeout)[1] for process in started]
    finally:
        for process in started:
            process.kill()
    return [process.returncode for process in started], logs


def assert_one_line_each(codes, logs, told_line):
    """Process 0 ended with its full disk's error (exit 75), process 1 with `told_line` (exit 2), each in
    one line, neither with a traceback."""
    assert codes == [75, 2], [log[-2000:] for log in logs]
    own, told = (log.strip().splitlines()[-1] for log in logs)
    assert own.startswith("error: ") and "No space left on device" in own
    assert told == told_line
    assert "Traceback" not in logs[0] + logs[1]


TOLD = "error: process 0 of the run failed to write its metrics: OSError: [Errno 28] No space left on device"


@pytest.mark.slow  # two train.py processes on localhost, about 60 s
@pytest.mark.xdist_group("distributed-processes")
def test_a_metrics_write_failing_in_process_0_stops_both_with_one_line_each(data_dir, tmp_path):
    workdir = tmp_path / "run"
    codes, logs = two_processes(tmp_path, data_dir, "write")
    assert_one_line_each(codes, logs, TOLD)
    assert "writing the metrics of step 25 failed (OSError: [Errno 28] No space left on device)" in logs[0]
    # Stopped at step 30, where they next exchange, before any checkpoint after the failure: resumed
    # from step 20, the run writes steps 21 to 30 again.
    assert Checkpointer(workdir / "checkpoints", read_only=True).steps() == [20]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert max(record["step"] for record in records) == 25


@pytest.mark.slow  # two train.py processes on localhost, about 40 s
@pytest.mark.xdist_group("distributed-processes")
def test_metrics_files_process_0_cannot_open_stop_both_before_the_first_step(data_dir, tmp_path):
    told = "error: process 0 of the run stopped before any work: OSError: [Errno 28] No space left on device"
    assert_one_line_each(*two_processes(tmp_path, data_dir, "open"), told)


@pytest.mark.slow  # two train.py processes on localhost, about 30 s
@pytest.mark.xdist_group("distributed-processes")
def test_last_metrics_process_0_fails_to_write_stop_both_with_one_line_each(data_dir, tmp_path):
    """last_metrics.json is written after the run's last collective: process 0 failed alone, and
    both then waited, process 1 in the run's summary (orbax's checkpoint managers wait for every
    process as they open), process 0 for it in jax's shutdown, past this test's 200 s."""
    assert_one_line_each(*two_processes(tmp_path, data_dir, "last", steps=20), TOLD)
    assert not (tmp_path / "run" / "last_metrics.json").exists()
    assert Checkpointer(tmp_path / "run" / "checkpoints", read_only=True).steps() == [20]  # the run's work is kept
