"""The incomplete copies of preparations killed outright (kill -9, power loss), which no later
preparation would otherwise remove. tfds writes a dataset config's copy into
`<data_dir>/<name>/<config>/incomplete.<6 capitals or digits>_<version>/` and renames it into place
once it is complete; a killed preparation leaves that folder (all it wrote: gigabytes on a big
corpus), and the next one writes a new one beside it. A download cut short leaves its temporary
folder, `<data_dir>/downloads/<name>/<file>.tmp.<32 hex digits>/`, alike.

Each preparation holds a shared lock (flock) on the config's folder while it lasts, released by
the kernel when its process dies, however it dies. One that finds no other holding it (granted the
exclusive lock) removes the incomplete folders there, each with a warning: no live preparation
writes in them. Where another preparation of the config runs, they are left for a later one; where
the file system has no locks (some network mounts), or where other programs may prepare the same
data without the lock (a tfds catalogue dataset), they are named in a warning instead. The
config's folder, when a failed preparation leaves it empty, is removed under the exclusive lock
alone, and a lock is kept only once the folder at its path is the one locked: every holder's lock
is on the folder its preparation writes in.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import re
import shutil
from collections.abc import Iterator

logger = logging.getLogger(__name__)

INCOMPLETE_FOLDER = re.compile(r"incomplete\.[A-Z0-9]{6}_.+")  # tfds's utils.file_utils._get_incomplete_dir
TEMPORARY_DOWNLOAD = re.compile(r".+\.tmp\.[0-9a-f]{32}")  # tfds's DownloadManager._download


class _NoLocks(Exception):
    """The file system takes no flock."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _flock(descriptor: int, operation: int) -> None:
    """fcntl.flock; BlockingIOError where another holds the lock, _NoLocks where none is to be had."""
    try:
        fcntl.flock(descriptor, operation)
    except BlockingIOError:
        raise
    except OSError as error:
        raise _NoLocks(error.strerror or str(error)) from None


class PreparationLock:
    """`acquire()` before a builder's preparation, `release()` after it; `folder`, the config's:
    the parent of the builder's `data_path`. `own`: a dataset of jaxformer's (multi30k,
    parallel_files), prepared by jaxformer alone; a tfds catalogue dataset's folder (wmt*), in a
    data_dir where other programs may prepare it too without this lock, has its incomplete
    folders named instead of removed. `leftovers`: the names of what killed preparations leave in
    `folder`; a downloading dataset's `<data_dir>/downloads/<name>/` has its own lock, for the
    temporary folders of downloads cut short (TEMPORARY_DOWNLOAD)."""

    def __init__(self, folder: pathlib.Path, dataset: str, own: bool, leftovers: re.Pattern = INCOMPLETE_FOLDER):
        self.folder, self.dataset, self.own, self.leftovers = folder, dataset, own, leftovers
        self._descriptor: int | None = None

    def acquire(self) -> None:
        """Holds the shared lock, first removing the incomplete folders if no other preparation
        holds it; where locks are not to be had, names them instead."""
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                descriptor = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue  # removed meanwhile by a failed preparation's clean-up: made again
            try:
                locked = self._lock_shared(descriptor)
            except _NoLocks as error:  # whether a folder is live cannot be told
                os.close(descriptor)
                self._name_incomplete_folders(
                    f"cannot lock {self.folder} ({error.reason}) to tell whether another process is preparing it"
                )
                return
            except BaseException:
                os.close(descriptor)
                raise
            if locked:
                self._descriptor = descriptor
                return
            os.close(descriptor)

    def _lock_shared(self, descriptor: int) -> bool:
        """The shared lock on `descriptor`, incomplete folders removed first where no other
        preparation runs; False where the folder at the path is no longer the one locked."""
        try:
            _flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another preparation of this config runs: its folder is live
            _flock(descriptor, fcntl.LOCK_SH)
            return self._is_locked_folder(descriptor)
        if not self._is_locked_folder(descriptor):
            return False
        if self.own:
            self._remove_incomplete_folders()
        else:
            self._name_incomplete_folders("no jaxformer run is preparing it now, but another program may be")
        # Not atomic (the exclusive lock is let go first), and no folder of this preparation exists
        # yet: another one's clean-up may come in between, which may remove the folder if it is empty.
        _flock(descriptor, fcntl.LOCK_SH)
        return self._is_locked_folder(descriptor)

    def _is_locked_folder(self, descriptor: int) -> bool:
        try:
            now = os.stat(self.folder)
        except FileNotFoundError:
            return False
        locked = os.fstat(descriptor)
        return (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino)

    def alone(self) -> bool:
        """On the way out of a failed preparation: whether no other preparation of the config
        runs (the exclusive lock granted), so that folders left empty may be removed. True where
        no lock could be had: the clean-up removes empty folders only, as before there were locks."""
        if self._descriptor is None:
            return True
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    @contextlib.contextmanager
    def alone_meanwhile(self) -> Iterator[bool]:
        """Held shared: whether, for the body, the exclusive lock is held (granted where no other
        process holds the config's lock: none prepares it, reuses it or writes in it meanwhile),
        then the shared lock again. False where another holds it, or no lock is to be had."""
        if self._descriptor is None:
            yield False
            return
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            granted = True
        except OSError:  # (the shared lock let go with the failed conversion: taken again below)
            granted = False
        try:
            yield granted
        finally:
            fcntl.flock(self._descriptor, fcntl.LOCK_SH)

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def _incomplete_folders(self) -> list[pathlib.Path]:
        return [
            path
            for path in sorted(self.folder.iterdir())
            if self.leftovers.fullmatch(path.name) and path.is_dir() and not path.is_symlink()
        ]

    def _remove_incomplete_folders(self) -> None:
        for path in self._incomplete_folders():
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                logger.warning("cannot remove %s, left by a preparation of %s that was killed", path, self.dataset)
            else:
                logger.warning(
                    "removed %s, left by a preparation of %s that was killed before it was complete",
                    path,
                    self.dataset,
                )

    def _name_incomplete_folders(self, why_not_removed: str) -> None:
        folders = self._incomplete_folders()
        if folders:
            logger.warning(
                "%s may be left by a preparation of %s that was killed; %s: delete %s if none is",
                ", ".join(map(str, folders)),
                self.dataset,
                why_not_removed,
                "it" if len(folders) == 1 else "them",
            )
