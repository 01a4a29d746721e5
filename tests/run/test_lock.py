"""One run per workdir: the lock file, its takeover from dead runs, and two train.py at once."""

import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from jaxformer.errors import UserError
from jaxformer.run.lock import AveragingLock, SweepLock, WorkdirLock, WorkdirLockedError
from tests.training.test_loop import command, environment, losses

# A child that takes a lock (its class, its workdir) and is killed at an os call (its name): where it
# would link its draft into place, or once it has moved a dead holder's lock aside ("rename").
KILLED_TAKING = textwrap.dedent(
    """
    import os, signal, sys
    from jaxformer.run import lock
    def killed(*args, call=getattr(os, sys.argv[3])):
        if sys.argv[3] == "rename":
            call(*args)
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(os, sys.argv[3], killed)
    getattr(lock, sys.argv[1])(sys.argv[2]).acquire()
    """
)
LOCKS = [
    (WorkdirLock, "lock", "training run"),
    (SweepLock, "sweep.lock", "jaxformer-sweep"),
    (AveragingLock, "averaged.lock", "jaxformer-average-checkpoints"),
]


def killed_while_taking(lock_type, workdir, at="link"):
    """The file that a process killed while taking `lock_type` (at os.`at`) left, as the real lock
    names it, and that process's pid."""
    before = set(workdir.iterdir())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", KILLED_TAKING, lock_type.__name__, str(workdir), at], env=env)
    assert child.wait(timeout=60) == -signal.SIGKILL
    (left,) = set(workdir.iterdir()) - before
    return left, child.pid


def dead_pid():
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def write_lock(workdir, name="lock", **fields):
    record = {"host": socket.gethostname(), "pid": os.getpid(), "start_ticks": None, "start_time": 0.0, "command": "x"}
    record.update(fields)
    (workdir / name).write_text(json.dumps(record))


def test_a_second_holder_is_refused_with_the_holder_named(tmp_path):
    with WorkdirLock(tmp_path) as lock:
        holder = json.loads(lock.path.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(WorkdirLockedError, match=rf"in use by another training run: pid {os.getpid()} on host"):
            WorkdirLock(tmp_path).acquire()
    assert not (tmp_path / "lock").exists()  # released
    with WorkdirLock(tmp_path):  # and free again
        pass


@pytest.mark.parametrize("lock_type, name, holder", LOCKS)
def test_a_folder_at_the_locks_path_is_refused_in_one_line_and_left_in_place(tmp_path, lock_type, name, holder):
    (tmp_path / name).mkdir()
    (tmp_path / name / "notes").write_text("mine")
    with pytest.raises(UserError) as refused:
        lock_type(tmp_path).acquire()
    assert str(refused.value) == f"{tmp_path / name} is a folder, where a {holder} keeps its lock file: move it away"
    assert sorted(path.name for path in tmp_path.iterdir()) == [name]  # not moved aside as a stale lock
    assert (tmp_path / name / "notes").read_text() == "mine"


@pytest.mark.parametrize("number", [errno.EROFS, errno.EACCES])
def test_a_workdir_that_cannot_be_written_is_refused_in_one_line(tmp_path, monkeypatch, number):
    """A workdir on a read-only mount (or without write permission): the lock is the first file a
    run writes there. Simulated: the tests may run as root, whom permissions do not stop."""

    def refused(path, *args, **kwargs):
        raise OSError(number, os.strerror(number), str(path))

    monkeypatch.setattr("jaxformer.run.lock.open", refused, raising=False)
    with pytest.raises(UserError) as error:
        WorkdirLock(tmp_path).acquire()
    assert str(error.value) == (
        f"cannot write {tmp_path / 'lock'} ({os.strerror(number)}): a training run keeps its lock file in "
        f"{tmp_path}, which must be writable"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(tmp_path, pid=dead.pid)
    with WorkdirLock(tmp_path) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert f"took over {tmp_path / 'lock'}" in caplog.text and f"pid {dead.pid}" in caplog.text


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path, caplog):
    # Our own pid, but a different process start time: the recorded process is gone.
    write_lock(tmp_path, start_ticks=1)
    with WorkdirLock(tmp_path):
        pass
    assert "took over" in caplog.text


def test_a_garbled_lock_file_is_taken_over(tmp_path, caplog):
    (tmp_path / "lock").write_text('{"host": "h", "pi')  # its writer died mid-write
    os.utime(tmp_path / "lock", (0, time.time() - 60))  # a minute ago
    with WorkdirLock(tmp_path):
        pass
    assert "unreadable lock file" in caplog.text


def test_a_lock_file_still_being_written_is_not_taken_for_a_dead_runs(tmp_path, monkeypatch):
    """Without hard links (gcsfuse) the lock is created empty, then written: a second run that
    reads it in between waits for the record instead of taking the lock over, which left two runs
    in one workdir."""
    import threading

    import jaxformer.run.lock as lock_module

    monkeypatch.setattr(os, "link", lambda *args: (_ for _ in ()).throw(PermissionError("no hard links")))
    (tmp_path / "lock").write_text("")  # created under O_EXCL by the first run, not yet written
    writer = threading.Timer(0.5, write_lock, (tmp_path,))  # its record, half a second later
    writer.start()
    with pytest.raises(WorkdirLockedError, match=rf"in use by another training run: pid {os.getpid()} on host"):
        WorkdirLock(tmp_path).acquire()
    writer.join()
    assert json.loads((tmp_path / "lock").read_text())["pid"] == os.getpid()  # left to its holder
    monkeypatch.setattr(lock_module, "WRITE_GRACE_SECONDS", 0.3)
    (tmp_path / "lock").write_text("")  # a writer that died before writing: taken over after the grace
    with WorkdirLock(tmp_path) as lock:
        assert lock.held


def test_a_lock_held_on_another_host_is_refused(tmp_path):
    write_lock(tmp_path, host="some-other-host", pid=1)
    with pytest.raises(WorkdirLockedError, match="on host 'some-other-host'.*another host"):
        WorkdirLock(tmp_path).acquire()
    assert json.loads((tmp_path / "lock").read_text())["host"] == "some-other-host"  # left alone


@pytest.mark.slow  # two runs; the lock itself is tested above
@pytest.mark.xdist_group("workdir-lock")
def test_two_train_runs_on_one_workdir(data_dir, tmp_path):
    workdir = tmp_path / "shared"
    overrides = (
        "--config.training.num_train_steps=6",
        "--config.training.checkpoint_every_steps=3",
        "--config.training.eval_every_steps=6",
    )
    processes = [
        subprocess.Popen(
            command(workdir, data_dir, *overrides, f"--config.training.seed={seed}"),
            env=environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    ]
    results = [(process.wait(timeout=600), process.stderr.read()) for process in processes]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(stderr for code, stderr in results if code == 2)
    assert refused.strip().splitlines()[-1].startswith(f"error: {workdir} is in use by another training run: pid ")
    # The winner's run is whole: each step logged once, its two checkpoints, the lock released.
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if "train/loss" in line]
    assert steps == list(range(1, 7))
    assert sorted(path.name for path in (workdir / "checkpoints").iterdir() if path.name.isdigit()) == ["3", "6"]
    assert not (workdir / "lock").exists()
    assert set(losses(workdir)) == set(range(1, 7))


def test_a_lock_being_written_is_never_seen_half_written(tmp_path, monkeypatch):
    """The record is complete before the lock's name exists: a second run that comes while the
    first is still writing it finds the name free (and takes it) or the whole record (and is
    refused), never an empty file it would take for a dead run's."""
    import jaxformer.run.lock as lock_module

    first, second = WorkdirLock(tmp_path), WorkdirLock(tmp_path)
    real_dump, seen = lock_module._write_record, []  # this module's writer only: other threads keep json.dump

    def slow_dump(record, handle):  # the second run tries while the first writes its record
        seen.append((tmp_path / "lock").exists())
        if len(seen) == 1:
            monkeypatch.setattr(lock_module, "_write_record", real_dump)
            second.acquire()
        real_dump(record, handle)

    monkeypatch.setattr(lock_module, "_write_record", slow_dump)
    with pytest.raises(WorkdirLockedError):
        first.acquire()  # the second took the name while the first was writing: the first is refused
    assert seen == [False] and second.held and not first.held
    assert json.loads((tmp_path / "lock").read_text())["pid"] == os.getpid()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lock"]  # no draft left behind
    second.release()


@pytest.mark.parametrize("lock_type, name, holder", LOCKS)
def test_the_lock_removes_the_drafts_of_killed_takers_and_nothing_else(tmp_path, caplog, lock_type, name, holder):
    """A process killed outright while it took the lock left its draft for good: the next to hold
    that lock removes the drafts of dead processes on this host, each with a warning; a live
    process's (trying the lock now) and another lock's stay, another host's are named."""
    left, dead = killed_while_taking(lock_type, tmp_path)
    assert left.name.startswith(f"{name}.draft-{socket.gethostname()}-{dead}-") and json.loads(left.read_text())
    host, sleeper = socket.gethostname(), subprocess.Popen(["sleep", "60"])
    try:
        torn = tmp_path / f"{name}.draft-{host}-{dead}-{uuid.uuid4().hex}"
        torn.write_text('{"host": "h", "pi')  # killed while writing its record
        reused = tmp_path / f"{name}.draft-{host}-{sleeper.pid}-{uuid.uuid4().hex}"  # a reused pid: not the sleeper
        write_lock(tmp_path, reused.name, pid=sleeper.pid, start_ticks=1)
        live = tmp_path / f"{name}.draft-{host}-{sleeper.pid}-{uuid.uuid4().hex}"
        elsewhere = tmp_path / f"{name}.draft-some-other-host-{dead}-{uuid.uuid4().hex}"
        kept = [live, elsewhere, tmp_path / f"{name}.draft-notes", tmp_path / f"{name}.draft-{host}-{dead}"]
        kept += [tmp_path / left.name.replace(name, other, 1) for _, other, _ in LOCKS if other != name]
        for path in kept:
            path.write_text("a user's")
        write_lock(tmp_path, name, pid=sleeper.pid)
        with pytest.raises(WorkdirLockedError):
            lock_type(tmp_path).acquire()  # refused: the drafts are cleaned only by the lock's holder
        assert left.exists() and torn.exists() and reused.exists()
        (tmp_path / name).unlink()
        with caplog.at_level(logging.WARNING, logger="jaxformer.run.lock"), lock_type(tmp_path):
            assert not any(path.exists() for path in (left, torn, reused))
            assert all(path.read_text() == "a user's" for path in kept)
        removed, lock = [(left, dead), (torn, dead), (reused, sleeper.pid)], tmp_path / name
        assert sorted(record.getMessage() for record in caplog.records) == sorted(
            [f"removed {path}, left by a {holder} (pid {pid}) killed while taking {lock}" for path, pid in removed]
            + [
                f"kept {elsewhere}, written by a {holder} on another host taking {lock}: this cannot "
                "check whether it still runs; delete it if that process is gone"
            ]
        )
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("lock_type, name, holder", LOCKS)
def test_the_lock_removes_the_stale_locks_of_killed_takers_and_nothing_else(tmp_path, caplog, lock_type, name, holder):
    """A process killed outright after moving a dead holder's lock aside, before removing it, left
    `<lock>.stale-<pid>` for good: the next to hold that lock removes those of dead pids, each with a
    warning; a live process's (removing its own just then), other locks' and look-alikes stay."""
    write_lock(tmp_path, name, pid=dead_pid())
    left, taker = killed_while_taking(lock_type, tmp_path, at="rename")
    assert left.name == f"{name}.stale-{taker}" and not (tmp_path / name).exists()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        kept = [tmp_path / f"{name}.stale-{suffix}" for suffix in (sleeper.pid, f"0{taker}", f"{taker}.bak", "notes")]
        kept += [tmp_path / f"{other}.stale-{taker}" for _, other, _ in LOCKS if other != name]
        for path in kept:
            path.write_text("a user's")
        write_lock(tmp_path, name, pid=sleeper.pid)
        with pytest.raises(WorkdirLockedError):
            lock_type(tmp_path).acquire()  # refused: the stale locks are removed only by the lock's holder
        assert left.exists()
        (tmp_path / name).unlink()
        with caplog.at_level(logging.WARNING, logger="jaxformer.run.lock"), lock_type(tmp_path):
            assert not left.exists()
            assert all(path.read_text() == "a user's" for path in kept)
        assert [record.getMessage() for record in caplog.records] == [
            f"removed {left}, left by a {holder} (pid {taker}) killed while taking over {tmp_path / name}"
        ]
    finally:
        sleeper.kill()
        sleeper.wait()
