"""Writing files so that a crash, a full disk or a kill never leaves half of one, and knowing
beforehand whether a folder can be written at all; reading a JSON object back, or None; a path's
"~" read as the shell reads it."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import secrets
import stat
import sys
import tempfile
from typing import Any

from jaxformer.deferred_signals import signals_deferred


def home_expanded(path: str) -> str:
    """`path` with a leading "~" or "~user" read as the shell reads it, that home folder: a flag's
    value written `--workdir=~/runs` reaches the command as it is (the shell expands "~" only at a
    word's start), and a config's path keys are never expanded by a shell. Anything else, an
    unknown user's "~name" included, is returned as given."""
    return os.path.expanduser(path)


def write_text_atomically(path: str | pathlib.Path, text: str) -> None:
    """Writes `text` (UTF-8) to `path` as `write_bytes_atomically` does."""
    write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: str | pathlib.Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file, flushed to disk, and a rename, so a
    failure never leaves half a file. A symbolic link stays a link: the file it points to gets the
    data, as a shell's `>` would do. A FIFO, a terminal or another device cannot be swapped for a
    new file, so it is written into directly."""
    path = pathlib.Path(path)
    descriptor = open_descriptor(path)
    try:
        if descriptor is not None:  # /dev/stdout and the like: what the shell redirected, kept as it is
            if descriptor in (1, 2):
                (sys.stdout if descriptor == 1 else sys.stderr).flush()  # what this process printed comes first
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            return
        try:
            existing_mode = path.stat().st_mode
        except FileNotFoundError:
            existing_mode = None
        if existing_mode is not None and not stat.S_ISREG(existing_mode):  # a FIFO or a device: no rename
            with open(path, "wb") as stream:
                stream.write(data)
            return
    except OSError as error:
        if error.filename is None:  # a write names no file; the error ("No space left on device") should
            error.filename = str(path)
        raise
    destination = written_file(path)
    descriptor, temporary = _create_unique_file(destination)
    try:
        with open(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())  # on disk before the rename makes it the file
        if existing_mode is not None:  # a replaced file keeps who may read and run it
            os.chmod(temporary, stat.S_IMODE(existing_mode))
        os.replace(temporary, destination)
    except BaseException:  # Ctrl-C included: never leave the temporary behind
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_to_stream(stream, text: str) -> None:
    """`text` (UTF-8) to a text stream such as sys.stdout, all of it or an OSError: a buffered
    writer whose pipe's reader went away part-way returns the count written instead of raising
    (CPython 3.11), and a text stream's write drops that count, so the output ended short and the
    command 'succeeded'."""
    stream.flush()  # what was printed before comes first
    if not hasattr(stream, "buffer"):  # a StringIO in its place (a caller capturing the output)
        stream.write(text)
        return
    view = memoryview(text.encode("utf-8"))
    while view:
        view = view[stream.buffer.write(view) :]
    stream.buffer.flush()


def read_json_object(path: pathlib.Path) -> dict[str, Any] | None:
    """The JSON object in the file at `path`, or None when it cannot be read as one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def open_descriptor(path: str | pathlib.Path) -> int | None:
    """The file descriptor of this process that `path` names (/dev/stdout, /dev/stderr, /dev/fd/N,
    /proc/self/fd/N), or None. Such a path is written through the descriptor: opened by name it
    would truncate, or be renamed over, a file the shell redirected stdout to (`>> log`)."""
    text = os.path.abspath(str(path))
    named = {"/dev/stdout": 1, "/dev/stderr": 2}
    if text in named:
        return named[text]
    for folder in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if text.startswith(folder) and text[len(folder) :].isdigit():
            return int(text[len(folder) :])
    return None


_TOKEN_BYTES = 4  # of randomness in a temporary's name: `.<name>.<8 hex digits>.tmp`


def _create_unique_file(destination: pathlib.Path) -> tuple[int, str]:
    """A new, empty, hidden file beside `destination` (the same file system, so the rename is
    atomic), open for writing. Unlike tempfile.mkstemp's 0600, its permissions are what the umask
    gives any new file, as writing `destination` directly would have."""
    while True:
        temporary = os.path.join(destination.parent, f".{destination.name}.{secrets.token_hex(_TOKEN_BYTES)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
        except FileExistsError:  # another writer's temporary, or a user's file: never touched
            continue


def leftover_temporaries(destination: str | pathlib.Path) -> list[pathlib.Path]:
    """The temporaries `write_bytes_atomically` made beside `destination` that are there now: plain
    files named as `_create_unique_file` names them, nothing else. A writer killed before its rename
    left each, unless one is writing it now, which only the caller can rule out."""
    destination = pathlib.Path(destination)
    name = re.compile(rf"\.{re.escape(destination.name)}\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}\.tmp")
    try:
        entries = sorted(destination.parent.iterdir())
    except OSError:  # no folder there, or one this process cannot list: none it could remove
        return []
    found = []
    for path in entries:
        if name.fullmatch(path.name):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                if stat.S_ISREG(path.lstat().st_mode):
                    found.append(path)
    return found


def unwritable_folder_reason(path: str | pathlib.Path) -> str | None:
    """Why files cannot be written under the folder `path` (created with its parents if missing),
    or None when they can: `not_a_folder_reason`, or the nearest folder above it that exists
    refuses a new entry (tried with an empty folder, removed at once)."""
    reason = not_a_folder_reason(path)
    if reason is not None:
        return reason
    existing = _nearest_existing(pathlib.Path(path).absolute())
    try:
        # A command's signal handler raises wherever the signal comes: between the probe's mkdir and
        # its rmdir, it left the probe in the user's folder (an empty --output then held it: in use).
        with signals_deferred():
            os.rmdir(tempfile.mkdtemp(prefix=".jaxformer-probe-", dir=existing))
    except OSError as error:
        return f"{existing} takes no new entries ({error.strerror})"
    return None


def not_a_folder_reason(path: str | pathlib.Path) -> str | None:
    """Why the folder `path` cannot be there or be made, or None: it, or the nearest thing above it
    that exists (named then), is a file or a link to one, or a link to nothing (mkdir does not
    follow a link, so it cannot create the link's target)."""
    path = pathlib.Path(path).absolute()
    existing = _nearest_existing(path)
    subject = "" if existing == path else f"{existing} "
    if not existing.exists():
        return f"{subject}is a link to {os.readlink(existing)}, which does not exist"
    if not existing.is_dir():
        link = f"a link to {os.readlink(existing)}, " if existing.is_symlink() else ""
        return f"{subject}is {link}a file, not a folder"
    return None


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    """`path`, or the nearest folder above it that exists; a link counts, even one to nothing."""
    while not path.exists() and not path.is_symlink():
        path = path.parent
    return path


def written_file(path: pathlib.Path) -> pathlib.Path:
    """The file a write of `path` replaces: where a symbolic link points (the link stays), else `path`."""
    return pathlib.Path(os.path.realpath(path)) if path.is_symlink() else path


def is_mount_point(path: str | pathlib.Path) -> bool:
    """Whether the folder `path` has a file system mounted on it (a Docker volume, a bind mount),
    which rename(2) cannot move or replace. os.path.ismount misses a bind mount of a folder of
    its parent's file system (same device); Linux lists every mount in /proc/self/mountinfo."""
    if os.path.ismount(path):
        return True
    try:
        with open("/proc/self/mountinfo", "rb") as handle:
            table = handle.read()
    except OSError:  # not Linux
        return False
    resolved = os.path.realpath(path)
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 4:  # the fifth is the mount point, with space, tab, newline and backslash as \ooo
            where = re.sub(rb"\\([0-7]{3})", lambda match: bytes([int(match.group(1), 8)]), fields[4])
            if os.fsdecode(where) == resolved:
                return True
    return False
