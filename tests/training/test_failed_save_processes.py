"""A checkpoint save that fails in one process of a multi-process run (a file-size limit or a full
disk on its host): every process stops within seconds with one line, where each waited at a
barrier of orbax's the others never reached, for its 20-minute timeout, without a word."""

import jax
import numpy as np
import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training.test_distributed import limited_processes


def two_processes(workdir, data_dir, *overrides, limited=None):
    """Processes 0 and 1 of one run, process `limited` under a 100 kB file-size limit (its share of a
    checkpoint has a larger file): exit codes and stderrs. Generous on a loaded machine: a process
    left waiting waits 20 minutes."""
    steps = ("--config.training.checkpoint_every_steps=40", "--config.training.eval_every_steps=1000")
    return limited_processes(workdir, data_dir, *steps, *overrides, limited=limited, file_bytes=100_000, timeout=180)


@pytest.mark.slow  # two runs of two train.py processes on localhost, about 80 s
@pytest.mark.xdist_group("distributed-processes")
def test_a_save_failing_in_one_process_stops_both_with_one_line_each(data_dir, tmp_path):
    """The step-80 save fails in process 1: both stop within 10 steps (the steps at which they exchange
    signals), not at step 120, where the run next waits for that save."""
    workdir = tmp_path / "run"
    codes, logs = two_processes(workdir, data_dir, "--config.training.num_train_steps=40")
    assert codes == [0, 0], [log[-2000:] for log in logs]
    saved = Checkpointer(workdir / "checkpoints", read_only=True).restore_params(40)

    codes, logs = two_processes(workdir, data_dir, "--config.training.num_train_steps=200", limited=1)
    assert codes == [2, 2], [log[-2000:] for log in logs]
    told, own = (log.strip().splitlines()[-1] for log in logs)
    assert own.startswith("error: ") and own.endswith(
        "File too large [os_error_code='27']: a file-size limit (ulimit -f, or the file system's) stops it; raise it, "
        "then run the same command again (a training run resumes from its last checkpoint)"
    )
    assert told.startswith(f"error: process 1 of the run failed to save checkpoint 80 in {workdir / 'checkpoints'}: ")
    assert told.endswith("File too large [os_error_code='27']")
    assert "Traceback" not in logs[0] + logs[1]
    assert "I step 81: training loss" in logs[0] and "I step 120: training loss" not in logs[0]
    # Nothing lost: checkpoint 40 is the newest, bit for bit.
    reader = Checkpointer(workdir / "checkpoints", read_only=True)
    assert reader.steps() == [40]
    kept = reader.restore_params(40)
    assert jax.tree.structure(kept) == jax.tree.structure(saved)
    for got, want in zip(jax.tree.leaves(kept), jax.tree.leaves(saved)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
