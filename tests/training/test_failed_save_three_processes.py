"""A checkpoint save failing in a three-process run (train.py, jax.distributed on localhost): every
process stops within seconds, exit 2 with one `error:` line, the checkpoint before intact. With two
processes a barrier passes in both or in neither; with three, a withdrawal read another's in flight
(save_barrier.py), which a hook forces here at the exact point."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from jaxformer.run.checkpoint import Checkpointer
from tests.training.test_distributed import free_port
from tests.training.test_loop import command as train_command
from tests.xla_flags import xla_flags

# train.py under a hook (argv[1]): "limit:1" or "limit:1,2", those processes under a 20 kB file-size
# limit from step 40's save (their shares of it have larger files, as on a full disk: EFBIG); "rename",
# process 0's rename of step 40's folder refused (its finalize, the save's last write); "interleave",
# step 40's last barrier in the main thread (orbax's old_steps_to_remove) forced into this order:
# processes 1 and 2 arrive, 0 arrives last and passes, process 1 tells a failure of its writes, 1
# withdraws, 2 withdraws while 1's is in flight (taken back once 2 has), 0 leaves.
HOOKED = textwrap.dedent(
    """
    import resource, runpy, sys, threading, time
    import jax
    from jaxformer.run import save_barrier
    from orbax.checkpoint._src.path import async_path

    hook = sys.argv.pop(1)
    KEY = "synchronous/CheckpointManager:old_steps_to_remove"
    called, rename = save_barrier.SaveBarrier.__call__, async_path.rename

    def wait_for(client, key):  # 15 s at most: a step that never comes in this order
        for _ in range(1500):
            try:
                return client.key_value_try_get(key)
            except Exception:
                time.sleep(0.01)

    class Forced:
        def __init__(self, barrier):
            self.barrier, self.client, self.arrived, self.looked = barrier, barrier._client, False, False

        def __getattr__(self, name):
            return getattr(self.client, name)

        def key_value_increment(self, key, amount):
            index, hooked = self.barrier.index, f"{self.barrier.namespace}/hook"
            if amount == 1 and not self.arrived:
                self.arrived = True
                while index == 0 and int(wait_for(self.client, key) or 0) < 2:
                    time.sleep(0.01)
                if index == 1:
                    threading.Thread(target=self.tell, args=(key,)).start()
            elif amount == 1 and index == 0:
                wait_for(self.client, f"{hooked}/2")
            elif amount != 1 and index == 2:
                wait_for(self.client, f"{hooked}/1")
            value = self.client.key_value_increment(key, amount)
            if amount != 1 and index > 0:
                self.client.key_value_set(f"{hooked}/{index}", "withdrew")
                if index == 1:
                    wait_for(self.client, f"{hooked}/2")
            return value

        def tell(self, counter):
            while int(self.client.key_value_try_get(counter)) < 3:
                time.sleep(0.01)
            self.barrier.tell(PermissionError(13, "Permission denied", "40.orbax-checkpoint-tmp/state/d"))

        def key_value_try_get(self, key):
            if key.endswith("/failed") and self.arrived and not self.looked and self.barrier.index > 0:
                self.looked = True
                return wait_for(self.client, key)
            return self.client.key_value_try_get(key)

    def call(self, *, key, timeout_ms):
        if hook.startswith("limit:") and key == "synchronous/CheckpointManager:save_start" and self.step == 40:
            if str(self.index) in hook[6:].split(","):
                resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        main = threading.current_thread() is threading.main_thread()
        if hook == "interleave" and key == KEY and self.step == 40 and main:
            forced = Forced(self)
            self._client = forced
            try:
                return called(self, key=key, timeout_ms=timeout_ms)
            finally:
                self._client = forced.client
        return called(self, key=key, timeout_ms=timeout_ms)

    async def refused(source, target, *args, **kwargs):
        if hook == "rename" and jax.process_index() == 0 and target.name == "40":
            raise PermissionError(13, "Permission denied", str(source))
        return await rename(source, target, *args, **kwargs)

    save_barrier.SaveBarrier.__call__, async_path.rename = call, refused
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def hooked_processes(tmp_path, data_dir, hook, timeout=300, wrapper=HOOKED, count=3, steps=60):
    """Processes 0 to `count` - 1 of one run of `steps` steps (checkpoints every 20 steps), train.py
    under `wrapper` given `hook`: their exit codes, stderrs and the seconds between the first and the
    last to exit (None where one was killed, after `timeout` seconds)."""
    script = tmp_path / "hooked.py"
    script.write_text(wrapper)
    flags = ["--config.data.batch_size=6", "--config.data.eval_batch_size=6", "--config.training.eval_every_steps=1000"]
    flags += [f"--config.training.num_train_steps={steps}", "--config.training.checkpoint_every_steps=20"]
    flags += [f"--coordinator_address=127.0.0.1:{free_port()}", f"--num_processes={count}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = xla_flags(1)
    started = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                hook,
                *train_command(tmp_path / "run", data_dir, *flags, f"--process_id={index}")[1:],
            ],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        for index in range(count)
    ]
    logs, ended = [""] * count, [None] * count

    def reap(index):
        logs[index] = started[index].communicate()[1]
        ended[index] = time.monotonic()

    reapers = [threading.Thread(target=reap, args=(index,)) for index in range(count)]
    for reaper in reapers:
        reaper.start()
    deadline = time.monotonic() + timeout  # a loaded machine is slow; a process left waiting waits 5 minutes or more
    for reaper in reapers:
        reaper.join(max(0, deadline - time.monotonic()))
    for process in started:
        process.kill()
    for reaper in reapers:
        reaper.join()
    spread = max(ended) - min(ended) if None not in ended else None
    return [process.returncode for process in started], logs, spread


FILE_SIZE_LIMIT = (
    "error: File too large: a file-size limit (ulimit -f, or the file system's) stops it; raise it, then run the "
    "same command again (a training run resumes from its last checkpoint)"
)


@pytest.mark.slow  # four runs of three train.py processes on localhost, 50-120 s each on 2 shared cores
@pytest.mark.xdist_group("distributed-processes")
@pytest.mark.parametrize("hook", ["limit:1", "limit:1,2", "rename", "interleave"])
def test_a_save_failing_in_a_three_process_run_stops_all_three_with_one_line_each(data_dir, tmp_path, hook):
    """Step 40's save fails in process 1 (its writes past a file-size limit, or its writes' failure
    told while every process waits at the save's last barrier in the main thread), in processes 1
    and 2, or in process 0's rename of the step's folder. The interleaving left process 0 at the
    training loop's exchange and 1 and 2 in jax's shutdown, waiting for each other until killed."""
    checkpoints = tmp_path / "run" / "checkpoints"
    codes, logs, spread = hooked_processes(tmp_path, data_dir, hook)
    assert codes == [2, 2, 2], [log[-2000:] for log in logs]
    assert spread < 30  # each stops at the failed save or the exchange after it, none waits for another
    lines = [log.strip().splitlines()[-1] for log in logs]
    assert "Traceback" not in "".join(logs)
    failing = {"limit:1": [1], "limit:1,2": [1, 2], "rename": [0], "interleave": [1]}[hook]
    told = [f"error: process {index} of the run failed to save checkpoint 40 in {checkpoints}: " for index in failing]
    for index, line in enumerate(lines):
        if index in failing and hook.startswith("limit:"):  # its own line, or the other's failure told first
            assert line == FILE_SIZE_LIMIT or line.startswith(tuple(told)) and "File too large" in line, line
        elif index in failing:
            assert line.startswith(f"error: cannot save checkpoint 40 in {checkpoints}: PermissionError: "), line
        else:
            assert line.startswith(tuple(told)), line
    reader = Checkpointer(checkpoints, read_only=True)
    assert reader.steps() == [20]  # step 40 never presented as written
    reader.restore_params(20)  # intact: its checksums verified
