"""A process of a two-process run (train.py, jax.distributed on localhost) killed (kill -9) in a save
whose failure it had told: the survivor ends with its `error:` line and exit code 2 within seconds,
where jax's shutdown barrier held it for the killed process until jax's heartbeat timeout aborted
it (exit -6, 60-100 s after the kill). The exit itself: tests/commands/test_failed_exit.py."""

import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training.test_failed_save_three_processes import hooked_processes
from tests.training.test_lost_process import hooked_train

# train.py, process 1 telling a failure of its part of step 40's save at the save's first barrier,
# then killed there before it withdraws (the barrier's verdict is process 0's: failed).
TOLD_THEN_KILLED = hooked_train(
    """
    import os, signal
    from jaxformer.run import save_barrier

    called = save_barrier.SaveBarrier.__call__

    def call(self, *, key, timeout_ms):
        if self.index == 1 and self.step == 40:
            self.tell(PermissionError(13, "Permission denied", "40.orbax-checkpoint-tmp"))
            os.kill(os.getpid(), signal.SIGKILL)
        return called(self, key=key, timeout_ms=timeout_ms)

    save_barrier.SaveBarrier.__call__ = call
    """
)


@pytest.mark.slow  # two train.py processes on localhost, 30-65 s on 2 shared cores
@pytest.mark.xdist_group("distributed-processes")
def test_the_survivor_of_a_process_killed_in_a_save_ends_with_its_error_within_seconds(data_dir, tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    codes, logs, spread = hooked_processes(tmp_path, data_dir, "killed", timeout=200, wrapper=TOLD_THEN_KILLED, count=2)
    assert codes == [2, -9], logs[0][-2000:]
    assert spread < 30  # from the kill to the survivor's end: its wait for the others (10 s) and its line
    error = "PermissionError: [Errno 13] Permission denied: '40.orbax-checkpoint-tmp'"
    told = f"error: process 1 of the run failed to save checkpoint 40 in {checkpoints}: {error}"
    assert logs[0].strip().splitlines()[-1] == told
    assert logs[0].count("\nerror: ") == 1 and "Traceback" not in logs[0]
    reader = Checkpointer(checkpoints, read_only=True)
    assert reader.steps() == [20]  # step 40 never presented as written
    reader.restore_params(20)  # intact: its checksums verified
