"""One training run per workdir, one jaxformer-sweep per sweep directory and one averaging per
workdir's averaged/: a lock file taken before anything is written (`<workdir>/lock`; a sweep's
`sweep.lock`, `SweepLock`; `<workdir>/averaged.lock`, `AveragingLock`).

`<workdir>/lock` holds the holder's host, pid, process start time and command line. It is
created whole by a hard link (which, like O_CREAT | O_EXCL, fails when the name exists; O_EXCL
where the filesystem has no hard links), so of two runs started together exactly one gets it. A lock
left by a dead process on this host (kill -9, power loss) is taken over with a warning; a live
holder, or one on another host (which cannot be checked from here), is an error naming it. An
unreadable lock file is taken over only once it is WRITE_GRACE_SECONDS old: under O_EXCL the
file exists, empty, before its holder writes the record, and a slow filesystem may show it so.

The draft a process writes its record to, `<lock>.draft-<host>-<pid>-<32 hex digits>`, stays for
good where that process is killed outright before it removes it. A process that has just taken the
lock removes those of that lock left by dead processes on its host, each named in a warning; a live
process's draft is its own to remove (it is trying the lock now), and another host's is named in one
warning, for the user to delete: whether its process still runs cannot be checked from here.
Likewise a stale lock a taker moved aside, `<lock>.stale-<pid>`, stays where the taker is killed
before it removes it: the next holder removes those whose pid no longer runs on its host (by the pid
alone: the file's record is the dead holder's, not the taker's), each named in a warning.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pathlib
import re
import socket
import sys
import time
import uuid

from jaxformer.errors import UserError
from jaxformer.run.directory import RunDirectory, SweepDirectory

logger = logging.getLogger(__name__)

WRITE_GRACE_SECONDS = 10.0  # an unreadable lock file younger than this may still be being written
_POLL_SECONDS = 0.1


def _write_record(record: dict, handle) -> None:
    json.dump(record, handle)


class WorkdirLockedError(UserError):
    """Another run holds the workdir."""


def _process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def _is_alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    current = _process_start_ticks(pid)
    return start_ticks is None or current is None or current == start_ticks


def _draft_path(lock: pathlib.Path) -> pathlib.Path:
    """A file of this process's own, even beside another lock of this process (two WorkdirLocks,
    or two threads)."""
    return lock.with_name(f"{lock.name}.draft-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}")


def _draft_writers(lock: pathlib.Path) -> list[tuple[pathlib.Path, str, int]]:
    """The drafts of `lock` beside it, with the host and pid of each one's writer (as
    `_draft_path` names them; any other file is not a draft)."""
    pattern = re.compile(rf"{re.escape(lock.name)}\.draft-(.+)-([1-9][0-9]{{0,9}})-[0-9a-f]{{32}}")
    drafts = []
    for path in sorted(lock.parent.iterdir()):
        match = pattern.fullmatch(path.name)
        if match and path.is_file() and int(match[2]) < 2**31:  # a pid os.kill takes
            drafts.append((path, match[1], int(match[2])))
    return drafts


def _stale_movers(lock: pathlib.Path) -> list[tuple[pathlib.Path, int]]:
    """The stale locks moved aside beside `lock` (`<lock>.stale-<pid>`, as `acquire` names them),
    with the pid of the process that moved each (any other file is not one)."""
    pattern = re.compile(rf"{re.escape(lock.name)}\.stale-([1-9][0-9]{{0,9}})")
    moved = []
    for path in sorted(lock.parent.iterdir()):
        match = pattern.fullmatch(path.name)
        if match and path.is_file() and int(match[1]) < 2**31:  # a pid os.kill takes
            moved.append((path, int(match[1])))
    return moved


def _recorded_start_ticks(draft: pathlib.Path, pid: int) -> int | None:
    """The process start time in `draft`'s record, where its writer lived to write it whole."""
    try:
        record = json.loads(draft.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("pid") != pid or not isinstance(record.get("start_ticks"), int):
        return None
    return record["start_ticks"]


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("start_time", 0)))
    return f"pid {holder.get('pid')} on host {holder.get('host')!r}, started {started}"


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds `<workdir>/lock` for the block (process 0 of a run)."""

    HOLDER = "training run"  # what holds the lock, for the error naming it

    def __init__(self, workdir: str | os.PathLike):
        self.path = self._lock_path(workdir)
        self.held = False

    @staticmethod
    def _lock_path(workdir: str | os.PathLike) -> pathlib.Path:
        return RunDirectory(workdir).lock_file

    def _record(self) -> dict:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_ticks": _process_start_ticks(os.getpid()),
            "start_time": time.time(),
            "command": " ".join(sys.argv),
        }

    def _read_holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # torn or garbled: its writer died while writing it

    def _settled_holder(self) -> dict | None:
        """`_read_holder`'s answer, but an unreadable file is read again until it is whole or
        WRITE_GRACE_SECONDS old (by its modification time, and at most that long from now): a run
        that just created it under O_EXCL is still writing its record."""
        deadline = time.monotonic() + WRITE_GRACE_SECONDS
        while True:
            holder = self._read_holder()
            if holder is None or isinstance(holder.get("pid"), int):
                return holder
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            if age >= WRITE_GRACE_SECONDS or time.monotonic() >= deadline:
                return holder
            time.sleep(_POLL_SECONDS)

    def _try_create(self) -> bool:
        """The lock file appears whole or not at all: the record is written to a file of this
        process's own, then hard-linked to the lock's name (which fails when the name exists,
        as O_EXCL does), so no other run can read a lock file still being written and take it
        for a dead one's."""
        draft = _draft_path(self.path)
        try:
            handle = open(draft, "w", encoding="utf-8")
        except OSError as error:  # a full disk keeps its own line and exit code
            if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise UserError(
                f"cannot write {self.path} ({error.strerror}): a {self.HOLDER} keeps its lock file in "
                f"{self.path.parent}, which must be writable"
            ) from None
        with handle:
            _write_record(self._record(), handle)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(draft, self.path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: exclusive creation, then the record
            return self._try_create_exclusive()
        finally:
            draft.unlink(missing_ok=True)
        return True

    def _try_create_exclusive(self) -> bool:
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            _write_record(self._record(), handle)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def acquire(self) -> None:
        if self.path.is_dir():  # no process's lock: taken over, it would be moved aside, then fail to be removed
            raise UserError(f"{self.path} is a folder, where a {self.HOLDER} keeps its lock file: move it away")
        for _ in range(3):  # a takeover race with another run retries, then reports the winner
            if self._try_create():
                self.held = True
                self._remove_killed_takers_files()
                return
            holder = self._settled_holder()
            if holder is None:
                continue  # released between our create and our read
            same_host = holder.get("host") == socket.gethostname()
            pid = holder.get("pid")
            garbled = not isinstance(pid, int)
            if not garbled and (not same_host or _is_alive(pid, holder.get("start_ticks"))):
                where = "" if same_host else " (another host: this cannot check whether it still runs)"
                raise WorkdirLockedError(
                    f"{self.path.parent} is in use by another {self.HOLDER}: {_describe(holder)}{where}; "
                    f"wait for it, use another --workdir, or delete {self.path} if that process is gone"
                )
            # Its holder is dead: move the stale file aside atomically (only one taker wins the
            # rename), then create our own.
            stale = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}")
            try:
                os.rename(self.path, stale)
            except FileNotFoundError:
                continue
            stale.unlink(missing_ok=True)
            logger.warning(
                "took over %s from a %s that is no longer alive (%s)",
                self.path,
                self.HOLDER,
                _describe(holder) if not garbled else "unreadable lock file",
            )
        raise WorkdirLockedError(
            f"{self.path.parent} is in use by another {self.HOLDER} that started just now ({self.path})"
        )

    def _remove_killed_takers_files(self) -> None:
        """Removes what processes killed outright on this host while taking this lock left: their
        drafts (`_draft_path`) and the stale locks they moved aside (`acquire`), with a warning
        naming each; names another host's drafts in one warning."""
        host = socket.gethostname()
        elsewhere = []
        for path, writer_host, pid in _draft_writers(self.path):
            if writer_host != host:
                elsewhere.append(path)
                continue
            if not _is_alive(pid, _recorded_start_ticks(path, pid)):  # one killed mid-record: its pid alone
                self._remove_left(path, f"left by a {self.HOLDER} (pid {pid}) killed while taking {self.path}")
        if elsewhere:
            logger.warning(
                "kept %s, written by a %s on another host taking %s: this cannot check whether it still runs; "
                "delete it if that process is gone",
                ", ".join(str(path) for path in elsewhere),
                self.HOLDER,
                self.path,
            )
        for path, pid in _stale_movers(self.path):
            if not _is_alive(pid, None):  # a live one is removing it now
                self._remove_left(path, f"left by a {self.HOLDER} (pid {pid}) killed while taking over {self.path}")

    @staticmethod
    def _remove_left(path: pathlib.Path, left_by: str) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as error:
            logger.warning("cannot remove %s (%s), %s", path, error.strerror, left_by)
            return
        logger.warning("removed %s, %s", path, left_by)

    def release(self) -> None:
        if not self.held:
            return
        holder = self._read_holder()
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class SweepLock(WorkdirLock):
    """`with SweepLock(directory):` holds a sweep directory's `sweep.lock` for a jaxformer-sweep
    invocation, which reads sweep.jsonl at its start and writes it again at its end: a second
    invocation beside it would drop the first one's rows (or it the second's)."""

    HOLDER = "jaxformer-sweep"

    @staticmethod
    def _lock_path(workdir: str | os.PathLike) -> pathlib.Path:
        return SweepDirectory(workdir).lock_file


class AveragingLock(WorkdirLock):
    """`with AveragingLock(workdir):` holds `<workdir>/averaged.lock` while jaxformer-average-checkpoints
    averages into averaged/: two at once would each set the other's step aside, or put back the
    previous version the other is replacing (run/interrupted_saves.py). A training run in the workdir
    writes averaged/ only to set aside its steps after the checkpoint it resumes from, holding this
    lock for that alone (run/rolled_back.py), so this lock is not the workdir's."""

    HOLDER = "jaxformer-average-checkpoints"

    @staticmethod
    def _lock_path(workdir: str | os.PathLike) -> pathlib.Path:
        return RunDirectory(workdir).averaging_lock_file
