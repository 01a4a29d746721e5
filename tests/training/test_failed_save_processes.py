"""A checkpoint save that fails in one process of a multi-process run (a file-size limit or a full
disk on its host): every process stops within seconds with one line, where each waited at a
barrier of orbax's the others never reached, for its 20-minute timeout, without a word."""

import textwrap

import jax
import numpy as np
import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training import test_metrics_failure_processes
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


# train.py, process 1's data position (grain's, written while orbax's save is still in the main thread,
# before its barrier that lists the old steps to remove) failing as on a full disk.
DATA_POSITION_FULL = textwrap.dedent(
    """
    import runpy, sys
    import jax
    from grain._src.python.checkpoint import handler

    sys.argv.pop(1)  # what fails: the data position
    original = handler.CheckpointHandler.save

    def save(self, directory, item=None, args=None):
        if jax.process_index() == 1:
            raise OSError(28, "No space left on device")
        return original(self, directory, item, args)

    handler.CheckpointHandler.save = save
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.slow  # two train.py processes on localhost, about 40 s
@pytest.mark.xdist_group("distributed-processes")
def test_a_save_failing_in_its_synchronous_part_in_one_process_stops_both_with_one_line_each(data_dir, tmp_path):
    """Process 1 stopped at step 20's save, and process 0 waited in orbax's next barrier of it (a
    collective of every device) until jax's shutdown barrier aborted both 5 minutes later (exit 134),
    process 0 without a word."""
    workdir = tmp_path / "run"
    processes = test_metrics_failure_processes.two_processes
    codes, logs = processes(tmp_path, data_dir, "data", steps=40, wrapper=DATA_POSITION_FULL)
    assert codes == [2, 75], [log[-2000:] for log in logs]
    told, own = (log.strip().splitlines()[-1] for log in logs)
    assert own.startswith("error: No space left on device")
    assert told == (
        f"error: process 1 of the run failed to save checkpoint 20 in {workdir / 'checkpoints'}: OSError: [Errno 28] "
        "No space left on device"
    )
    assert "Traceback" not in logs[0] + logs[1]
    assert Checkpointer(workdir / "checkpoints", read_only=True).steps() == []  # orbax's temporary folder, no step


# train.py, process 0 refused the step folder that orbax makes for each checkpoint (its temporary name,
# renamed once written: "mkdir"), or that rename, its background thread's last write ("rename"), as in a
# checkpoints folder made read-only.
STEP_FOLDER_REFUSED = textwrap.dedent(
    """
    import runpy, sys
    import jax
    from orbax.checkpoint._src.path import async_path

    failing = sys.argv.pop(1)
    original_mkdir, original_rename = async_path.mkdir, async_path.rename

    async def mkdir(path, *args, **kwargs):
        if jax.process_index() == 0 and failing == "mkdir" and path.parent.name == "checkpoints" and (
            ".orbax-checkpoint-tmp" in path.name
        ):
            raise PermissionError(13, "Permission denied", str(path))
        return await original_mkdir(path, *args, **kwargs)

    async def rename(source, target, *args, **kwargs):
        if jax.process_index() == 0 and failing == "rename" and target.name == "20":
            raise PermissionError(13, "Permission denied", str(source))
        return await original_rename(source, target, *args, **kwargs)

    async_path.mkdir, async_path.rename = mkdir, rename
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.slow  # two train.py processes on localhost, about 40 s each
@pytest.mark.xdist_group("distributed-processes")
@pytest.mark.parametrize("refused", ["mkdir", "rename"])
def test_a_step_folder_process_0_cannot_create_stops_both_with_one_line_each(data_dir, tmp_path, refused):
    """orbax made the step folder in a background thread of process 0, which kept its error: every
    process waited 5 minutes for the folder's signal, then ended with a traceback. Both now stop at
    that save, within seconds (the processes are killed after 2 minutes). The folder's rename, the
    last write of that thread, refused: its error was raised where process 0 next waited for the
    save, a traceback there (exit 1); one line now."""
    checkpoints = tmp_path / "run" / "checkpoints"
    processes = test_metrics_failure_processes.two_processes
    codes, logs = processes(tmp_path, data_dir, refused, steps=40, wrapper=STEP_FOLDER_REFUSED, timeout=120)
    assert codes == [2, 2], [log[-2000:] for log in logs]
    own, told = (log.strip().splitlines()[-1] for log in logs)
    error = f"PermissionError: [Errno 13] Permission denied: '{checkpoints / '20.orbax-checkpoint-tmp'}'"
    assert own == f"error: cannot save checkpoint 20 in {checkpoints}: {error}"
    assert told == f"error: process 0 of the run failed to save checkpoint 20 in {checkpoints}: {error}"
    assert "Traceback" not in logs[0] + logs[1]
    assert Checkpointer(checkpoints, read_only=True).steps() == []
