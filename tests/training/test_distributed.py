"""train.py across meshes, device counts and processes (subprocesses with simulated CPU devices)."""

import json
import os
import re
import resource
import shutil
import socket
import subprocess

import numpy as np
import pytest

from tests.training.test_loop import ONE_LAYER, losses
from tests.training.test_loop import command as train_command
from tests.xla_flags import xla_flags

COMMON = ("--config.data.batch_size=8", "--config.data.eval_batch_size=8")
LENGTH_FILTER = re.compile(r"the length filter dropped (\d+) of the (\d+) training pairs read")  # dropped, seen


def run(workdir, data_dir, devices, *overrides, extra_env=None, background=False):
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(devices)
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra_env or {})
    command = train_command(workdir, data_dir, *COMMON, *overrides)
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def assert_close(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)], rtol=1e-5)


@pytest.mark.slow  # two sharded runs; one mesh's step against another's is in test_sharding.py
@pytest.mark.xdist_group("distributed-restore")
def test_checkpoint_restores_under_another_mesh_and_device_count(data_dir, tmp_path):
    """Saved on 2 devices as (2, 1, 1), resumed on 4 as (1, 2, 2): the next 10 steps match.

    Sharded sums add in another order, so the runs drift apart by rounding; Adam's tiny eps
    amplifies that over tens of steps, hence 10 steps at 1e-5 rather than a whole run.
    """
    first = tmp_path / "first"
    steps = ("--config.training.num_train_steps=20", "--config.training.checkpoint_every_steps=10")
    run(first, data_dir, 2, "--config.mesh.shape=(2,1,1)", *steps)  # checkpoints at 10 and 20
    second = tmp_path / "second"
    shutil.copytree(first, second)
    shutil.rmtree(second / "checkpoints" / "20")  # as if the run had stopped at step 10
    result = run(second, data_dir, 4, "--config.mesh.shape=(1,2,2)", *steps)  # 4 devices, fsdp x tensor
    assert "resumed from step 10" in result.stderr and "'fsdp': 2, 'tensor': 2" in result.stderr
    logged = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert sum("train/loss" in record and record["step"] > 10 for record in logged) == 10  # the resumed run's
    copied = [json.loads(line) for line in (second / "metrics.rolled_back.jsonl").read_text().splitlines()]
    assert sum("train/loss" in record for record in copied) == 10  # the copied run's steps 11-20, moved aside
    straight, moved = losses(first), losses(second)
    assert_close({s: moved[s] for s in range(11, 21)}, {s: straight[s] for s in range(11, 21)})


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_processes(workdir, data_dir, *overrides):
    """Processes 0 and 1 of one run over jax.distributed on localhost (one device each), started."""
    port = free_port()
    coordination = (f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2")
    return [
        run(workdir, data_dir, 1, *overrides, *coordination, f"--process_id={index}", background=True)
        for index in range(2)
    ]


def limited_processes(workdir, data_dir, *overrides, limited: int, file_bytes: int, timeout: float):
    """Processes 0 and 1 of one run on localhost (one device each), process `limited` under a
    file-size limit of `file_bytes` (Python ignores SIGXFSZ: a write past it fails with EFBIG, as on a
    full disk): their exit codes and stderrs once both have ended (killed after `timeout` seconds)."""
    flags = (*COMMON, *overrides, f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = xla_flags(1)

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))

    started = [
        subprocess.Popen(
            train_command(workdir, data_dir, *flags, f"--process_id={index}"),
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            preexec_fn=small_files if index == limited else None,
        )
        for index in range(2)
    ]
    try:
        logs = [process.communicate(timeout=timeout)[1] for process in started]
    finally:
        for process in started:
            process.kill()
    return [process.returncode for process in started], logs


def _two_started_apart(data_dir, workdirs, overrides):
    """Processes 0 and 1 of one run, each with its own workdir and overrides; their exit codes and logs."""
    port = free_port()
    coordination = (f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2")
    processes = [
        run(workdir, data_dir, 1, *extra, *coordination, f"--process_id={index}", background=True)
        for index, (workdir, extra) in enumerate(zip(workdirs, overrides))
    ]
    results = [process.communicate(timeout=300)[1] for process in processes]
    return [process.returncode for process in processes], results


@pytest.mark.slow  # ~25 s of two-process starts; one process's command-line error in both: the test below
@pytest.mark.xdist_group("distributed-processes")
def test_processes_started_apart_are_refused_before_any_work(data_dir, tmp_path):
    """Another learning rate in one process trained apart without a word; another step count left
    the others waiting forever; a workdir on each host's own disk failed at the first checkpoint.
    Each is now one line in every process, before anything is prepared or written."""
    from jaxformer.training.config_file import load_config

    scales = [load_config("tiny").optimizer.learning_rate_scale, 3.0]
    workdir = tmp_path / "run"
    codes, logs = _two_started_apart(
        data_dir, [workdir, workdir], [(), (f"--config.optimizer.learning_rate_scale={scales[1]}",)]
    )
    assert codes == [2, 2], [log[-2000:] for log in logs]
    for index, log in enumerate(logs):
        assert log.strip().splitlines()[-1] == (
            "error: the processes were started with different configs: optimizer.learning_rate_scale differ "
            f"between them (process {index} has optimizer.learning_rate_scale={scales[index]!r}); run the "
            "same command on every host"
        )
    assert not workdir.exists()

    apart = [tmp_path / "host0", tmp_path / "host1"]  # each process's own folder
    codes, logs = _two_started_apart(data_dir, apart, [(), ()])
    assert codes == [2, 2], [log[-2000:] for log in logs]
    for log in logs:
        assert log.strip().splitlines()[-1] == (
            f"error: the workdir {apart[0]} is not one folder for every process: process(es) 1 do not see the file "
            "process 0 wrote into it; give a folder on a file system every host mounts (NFS, gcsfuse, ...)"
        ).replace(str(apart[0]), str(apart[0]) if log is logs[0] else str(apart[1]))
    assert not apart[0].exists() and not apart[1].exists()

    # What one process alone fails at (an invalid override, a workdir it cannot make) is an error in
    # both, the others quoting it, where it ended that process and left the others waiting.
    (tmp_path / "afile").write_text("x")
    for workdirs, extra, failing in (
        ([workdir, workdir], [(), ("--config.training.num_train_steps=-1",)], "config training.num_train_steps=-1"),
        ([workdir, tmp_path / "afile" / "sub"], [(), ()], f"cannot create the workdir {tmp_path / 'afile' / 'sub'}"),
    ):
        codes, logs = _two_started_apart(data_dir, workdirs, extra)
        assert codes == [2, 2], [log[-2000:] for log in logs]
        own, quoted = logs[1].strip().splitlines()[-1], logs[0].strip().splitlines()[-1]
        assert own.startswith(f"error: {failing}") and quoted == own.replace(
            "error: ", "error: process 1 of the run stopped before any work: ", 1
        )
        assert not workdir.exists()

    # Not a user's error, but one process's alone (a name the file system refuses): a traceback
    # there, and the other process told which process stopped and why, instead of waiting.
    codes, logs = _two_started_apart(data_dir, [workdir, tmp_path / ("x" * 300)], [(), ()])
    assert codes == [2, 1], [log[-2000:] for log in logs]
    assert (
        logs[0]
        .strip()
        .splitlines()[-1]
        .startswith("error: process 1 of the run stopped before any work: OSError: [Errno 36] File name too long")
    )
    assert not workdir.exists()


@pytest.mark.xdist_group("distributed-processes")
def test_a_command_line_error_in_one_process_is_raised_in_both(data_dir, tmp_path):
    """An override given twice in one process ended it at once, and the other waited 5 minutes,
    then aborted (exit 134): the processes now join first, as for an invalid override."""
    workdir = tmp_path / "run"
    twice = ("--config.data.max_length=16", "--config.data.max_length=16")
    codes, logs = _two_started_apart(data_dir, [workdir, workdir], [(), twice])
    assert codes == [2, 2], [log[-2000:] for log in logs]
    own = "error: config key 'data.max_length' is given twice, as '16' and as '16': keep one"
    assert logs[1].strip().splitlines()[-1] == own
    assert logs[0].strip().splitlines()[-1] == own.replace(
        "error: ", "error: process 1 of the run stopped before any work: "
    )
    assert not workdir.exists()


@pytest.mark.slow  # three two-process starts (~30 s): the race is lost in some of them, not in each
@pytest.mark.xdist_group("distributed-processes")
def test_an_error_in_every_process_leaves_no_workdir(data_dir, tmp_path):
    """Each process looked whether the workdir existed, then created it: a look after the other's
    mkdir took the folder for one given, and a mesh error in both left it behind, empty."""
    for attempt in range(3):  # the race was lost about one start in two
        workdir = tmp_path / f"run{attempt}"
        codes, logs = _two_started_apart(data_dir, [workdir, workdir], [("--config.mesh.shape=(1,1,2)",)] * 2)
        assert codes == [2, 2], [log[-2000:] for log in logs]
        assert "data-parallel shard (data x fsdp) span devices of several processes" in logs[0].strip().splitlines()[-1]
        assert not workdir.exists()


@pytest.mark.slow  # to the slow set (about 45 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
@pytest.mark.xdist_group("distributed-processes")
def test_two_processes_match_one_process(data_dir, tmp_path):
    steps = ("--config.training.num_train_steps=10", "--config.data.input_shards=2", *ONE_LAYER)
    single = tmp_path / "single"
    single_log = run(single, data_dir, 2, *steps).stderr
    double = tmp_path / "double"
    processes = two_processes(double, data_dir, *steps)
    logs = []
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
        logs.append(stderr)
    assert "process 1 of 2" in stderr
    # The length filter's counts are the run's, summed over both processes' shards: the same line in
    # each, and about what one process reading both shards counts (each process alone: about half).
    counts = [[tuple(map(int, found)) for found in LENGTH_FILTER.findall(log)] for log in (*logs, single_log)]
    assert len(counts[0]) == 1 and counts[0] == counts[1], counts
    (dropped, seen), ((_, single_seen),) = counts[0][0], counts[2]
    assert 0.9 < seen / single_seen < 1.1 and dropped <= seen, counts
    assert_close(losses(double), losses(single))
    assert sorted(losses(double)) == list(range(1, 11))
    # Validation split between the two processes' readers sums to what one process computes.
    for metric in ("eval/loss", "eval/accuracy"):
        assert sorted(losses(double, metric)) == [10]
        assert_close(losses(double, metric), losses(single, metric))
    # One process cannot take over two processes' data positions: said at once, and nothing is set aside.
    command = train_command(double, data_dir, *COMMON, *steps[1:], "--config.training.num_train_steps=12")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint {double / 'checkpoints' / '10'} was written by 2 processes, and this job has 1: each "
        "process's data position is its own, so resume with 2 processes, or start a new run from its parameters "
        "(training.init_from)"
    ), result.stderr[-2000:]
    assert sorted(path.name for path in (double / "checkpoints").iterdir()) == ["10"]


@pytest.mark.slow  # two 40-step runs (python -m pytest -m slow); bfloat16 numerics are unit-tested in tests/model
@pytest.mark.xdist_group("distributed-bf16")
@pytest.mark.parametrize("steps", [40])
def test_bfloat16_converges_like_float32(data_dir, tmp_path, steps):
    final = {}
    for dtype in ("float32", "bfloat16"):
        workdir = tmp_path / dtype
        run(
            workdir,
            data_dir,
            1,
            f"--config.model.dtype={dtype}",
            f"--config.training.num_train_steps={steps}",
            "--config.training.eval_every_steps=1000",
        )
        values = losses(workdir)
        final[dtype] = np.mean([values[s] for s in range(steps - 9, steps + 1)])  # the last 10 steps
        assert final[dtype] < values[1] - 1.0  # it learns
    assert abs(final["bfloat16"] - final["float32"]) / final["float32"] < 0.05, final


@pytest.mark.slow  # two processes trained until one is stopped; the agreement itself: test_signals.py
@pytest.mark.xdist_group("distributed-processes")
def test_sigterm_to_one_process_stops_both_with_one_checkpoint(data_dir, tmp_path):
    import signal
    import time

    workdir = tmp_path / "double"
    flags = ("--config.training.num_train_steps=100000", "--config.data.input_shards=2", *ONE_LAYER)
    processes = two_processes(workdir, data_dir, *flags)
    deadline = time.monotonic() + 300
    while not (workdir / "metrics.jsonl").exists() or max(losses(workdir), default=0) < 3:
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.5)
    processes[1].send_signal(signal.SIGTERM)  # one process only: as a preempted host's
    results = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [143, 143], [stderr[-2000:] for _, stderr in results]
    steps = sorted(int(path.name) for path in (workdir / "checkpoints").iterdir() if path.name.isdigit())
    assert len(steps) == 1 and steps[0] >= 3 and steps[0] % 10 == 0  # where both agreed to stop
    assert "SIGTERM received by another process" in results[0][1]
