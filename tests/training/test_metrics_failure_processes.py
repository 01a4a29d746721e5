"""A metrics write failing in process 0 of a two-process run (only process 0 writes metrics.jsonl
and TensorBoard): raised in process 0 alone, it left process 1 waiting in its next collective, and
process 0 for process 1 at its exit, until jax's 5-minute shutdown barrier aborted both (SIGABRT, no
line of the error in process 1). Both now stop at the next step they share, with one line each; or,
where process 0 cannot open its metrics files, before the first step."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training.test_distributed import COMMON, free_port
from tests.training.test_loop import command as train_command

# train.py, process 0's TensorBoard files failing as on a full disk: `write` from step 25, or `open`
# (a resumed run's first act on its metrics files).
FULL_DISK = textwrap.dedent(
    """
    import runpy, sys
    import jax
    from jaxformer.training import tensorboard

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
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def two_processes(tmp_path, data_dir, failing):
    """Processes 0 and 1 of one run of 100 steps, process 0's metrics `failing`: exit codes and stderrs."""
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    flags = (*COMMON, "--config.training.num_train_steps=100", "--config.training.eval_every_steps=1000")
    flags += (f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0"
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
        logs = [process.communicate(timeout=200)[1] for process in started]
    finally:
        for process in started:
            process.kill()
    return [process.returncode for process in started], logs


@pytest.mark.slow  # two train.py processes on localhost, about 60 s
@pytest.mark.xdist_group("distributed-processes")
def test_a_metrics_write_failing_in_process_0_stops_both_with_one_line_each(data_dir, tmp_path):
    workdir = tmp_path / "run"
    codes, logs = two_processes(tmp_path, data_dir, "write")
    assert codes == [75, 2], [log[-2000:] for log in logs]
    own, told = (log.strip().splitlines()[-1] for log in logs)
    assert own.startswith("error: ") and "No space left on device" in own
    assert (
        told == "error: process 0 of the run failed to write its metrics: OSError: [Errno 28] No space left on device"
    )
    assert "Traceback" not in logs[0] + logs[1]
    assert "writing the metrics of step 25 failed (OSError: [Errno 28] No space left on device)" in logs[0]
    # Stopped at step 30, where they next exchange, before any checkpoint after the failure: resumed
    # from step 20, the run writes steps 21 to 30 again.
    assert Checkpointer(workdir / "checkpoints", read_only=True).steps() == [20]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert max(record["step"] for record in records) == 25


@pytest.mark.slow  # two train.py processes on localhost, about 40 s
@pytest.mark.xdist_group("distributed-processes")
def test_metrics_files_process_0_cannot_open_stop_both_before_the_first_step(data_dir, tmp_path):
    codes, logs = two_processes(tmp_path, data_dir, "open")
    assert codes == [75, 2], [log[-2000:] for log in logs]
    own, told = (log.strip().splitlines()[-1] for log in logs)
    assert own.startswith("error: ") and "No space left on device" in own
    assert told == "error: process 0 of the run stopped before any work: OSError: [Errno 28] No space left on device"
    assert "Traceback" not in logs[0] + logs[1]
