"""A save failing in one process's main thread past that save's last barrier, in a two-process run
(train.py, jax.distributed on localhost): both stop within seconds, exit 2 with one `error:` line,
the checkpoints before intact. The other process waited for it at the next save's first barrier
until jax's shutdown barrier aborted both 5 minutes later (exit -6, no `error:` line)."""

import textwrap

import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training.test_failed_save_three_processes import hooked_processes

# train.py, process 1's main thread raising once where its wait for step 40's save has returned (every
# barrier of that save passed, at step 60's save), as a listing of the checkpoints folder refused would.
REFUSED_PAST_THE_BARRIERS = textwrap.dedent(
    """
    import runpy, sys
    import jax
    from jaxformer.run import checkpoint

    sys.argv.pop(1)
    waited, raised = checkpoint.wait_for_save, []

    def wait_for_save(manager, barrier, step, wait=None):
        waited(manager, barrier, step, wait)
        if jax.process_index() == 1 and step == 40 and wait is None and not raised:
            raised.append(step)
            raise PermissionError(13, "Permission denied", str(manager.directory))

    checkpoint.wait_for_save = wait_for_save
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.slow  # two train.py processes on localhost, 40-90 s on 2 shared cores
@pytest.mark.xdist_group("distributed-processes")
def test_a_save_failing_in_one_process_past_its_last_barrier_stops_both_with_one_line_each(data_dir, tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    codes, logs, spread = hooked_processes(
        tmp_path, data_dir, "past", timeout=150, wrapper=REFUSED_PAST_THE_BARRIERS, count=2
    )
    assert codes == [2, 2], [log[-2000:] for log in logs]
    assert spread < 30  # process 0 stops at the first barrier after it (a step's metadata read, then step 60's)
    error = f"PermissionError: [Errno 13] Permission denied: '{checkpoints}'"
    told, own = (log.strip().splitlines()[-1] for log in logs)
    assert own == f"error: cannot save checkpoint 40 in {checkpoints}: {error}"  # the save it waited for
    assert told == f"error: process 1 of the run failed to save checkpoint 40 in {checkpoints}: {error}"
    assert [log.count("\nerror: ") for log in logs] == [1, 1] and "Traceback" not in "".join(logs)
    reader = Checkpointer(checkpoints, read_only=True)
    assert reader.steps() == [20, 40]  # step 60 never begun
    reader.restore_params(40)  # intact: its checksums verified
