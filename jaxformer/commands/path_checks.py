"""The paths a command's flags name, checked before any expensive work: a file to read, a file
to write (never one being read), a training run's workdir. Each failure is one `FlagError` line
naming the flag and the path."""

from __future__ import annotations

import errno
import os
import pathlib
import tempfile

from jaxformer.commands.common import FlagError
from jaxformer.files import not_a_folder_reason, open_descriptor, written_file


def check_workdir(workdir: str, flag: str = "--workdir", what: str = "a training run's workdir") -> None:
    """`workdir` is an existing directory, `what` (for the error) names what it should be."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise FlagError(f"{flag} {workdir}: not a directory ({what} is one)")
    if not os.path.isdir(workdir):
        raise FlagError(f"{flag} {workdir}: no such directory")


def check_readable_file(path: str | None, flag: str) -> None:
    if path is None:
        return
    refuse_a_dash(path, flag, "stdin")
    refuse_a_folder_ending(path, flag)
    refuse_an_unnameable_path(path, flag)
    if os.path.isdir(path):
        raise FlagError(f"{flag} {path}: is a directory, not a file")
    if os.path.islink(path) and not os.path.exists(path):
        raise FlagError(f"{flag} {path}: a symbolic link to {os.readlink(path)}, which does not exist")
    # Anything else that exists can be read once, as common.read_lines does: a pipe, a process
    # substitution's /dev/fd/63 and /dev/stdin are not regular files.
    if not os.path.exists(path):
        raise FlagError(f"{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise FlagError(f"{flag} {path}: not readable")


def check_writable_file(
    path: str | None, flag: str, overwrite: bool = False, inputs: dict[str, str | None] | None = None
) -> None:
    """Fails now, not after the decoding, if `path` cannot be written: it is a directory or a
    socket, it ends as only a folder's path does (`out/`: not the file `out`), its folder is
    missing, or a file cannot be created there (permissions, read-only disk); or if it is an
    existing file, unless `overwrite`; or if it is the same regular file as one of the
    command's `inputs` ({flag: path}), whatever `overwrite` says, since writing it would destroy
    what is being read. A symbolic link is checked as the file it points to, which is what
    write_text_atomically replaces; an existing FIFO or device (/dev/stdout) is written into, so
    only its own permission matters."""
    if path is None:
        return
    refuse_a_dash(path, flag, "stdout")
    refuse_a_folder_ending(path, flag)
    refuse_an_unnameable_path(path, flag)
    if open_descriptor(path) is not None:  # written through this process's descriptor, as the shell set it up
        if not os.access(path, os.W_OK):
            raise FlagError(f"{flag} {path}: not writable")
        return
    target = pathlib.Path(path)
    if target.is_dir():
        raise FlagError(f"{flag} {path}: is a directory")
    for input_flag, input_path in (inputs or {}).items():
        if (
            input_path is not None
            and target.is_file()
            and os.path.exists(input_path)
            and os.path.samefile(target, input_path)
        ):
            raise FlagError(f"{flag} {path}: is the {input_flag} file; writing it would destroy what is read")
    if target.is_file() and not overwrite:  # a FIFO or a device (/dev/stdout) is written into, not replaced
        raise FlagError(f"{flag} {path}: already exists; pass --overwrite to replace it")
    if target.is_socket():
        raise FlagError(f"{flag} {path}: is a socket, which cannot be written as a file")
    if target.exists() and not os.access(target, os.W_OK):
        raise FlagError(f"{flag} {path}: not writable")
    if target.exists() and not target.is_file():
        return
    destination = written_file(target)
    folder = destination.parent
    if not folder.is_dir():  # a file (or a link to nothing) on the way is named as such, not as missing
        raise FlagError(f"{flag} {path}: {not_a_folder_reason(destination) or f'the folder {folder} does not exist'}")
    try:  # the real test: permission bits do not tell about read-only mounts, or bind root
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{destination.name}.", suffix=".probe"):
            pass
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:  # the name itself fits, but not the temporary's beside it
            raise FlagError(
                f"{flag} {path}: its name is too long to write: it is written as .<name>.<8 characters>.tmp first, "
                f"longer than its file system takes ({error.strerror}); give a shorter name"
            ) from None
        raise FlagError(f"{flag} {path}: cannot write in {folder} ({error.strerror})") from None


def refuse_a_dash(path: str, flag: str, stream: str) -> None:
    """`-`, which many programs read as stdin or stdout, would be a file named `-` here: written
    into the current folder, with nothing on stdout, or read from it."""
    if path == "-":
        raise FlagError(f"{flag} -: is no {stream} here; give /dev/{stream} for {stream}, or ./- for a file named -")


def refuse_an_unnameable_path(path: str, flag: str) -> None:
    """A path through symbolic links that lead back to themselves, or one longer than its file
    system takes, names nothing: as an output the first passed the other checks and its write
    failed in a traceback, after all the decoding; the second was a traceback."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FlagError(f"{flag} {path}: its symbolic links form a loop, so it names no file") from None
        if error.errno == errno.ENAMETOOLONG:
            raise FlagError(f"{flag} {path}: longer than its file system takes ({error.strerror})") from None


def refuse_a_folder_ending(path: str, flag: str) -> None:
    """`out/` (or `out/.`), not an existing folder: pathlib drops the ending, and would write (or
    replace) the file `out`; read, `f/` of a file f is "no such file", though f is there."""
    ending = folder_ending(path)
    if ending and not os.path.isdir(path):
        raise FlagError(f"{flag} {path}: ends in {ending!r}, as a folder's path does; give a file's path")


def folder_ending(path: str) -> str:
    """The end of `path` that makes it a folder's path (a separator, `/.`, `/..`), or ""."""
    separators = os.sep + (os.altsep or "")
    if path.endswith(tuple(separators)):
        return path[-1]
    name = os.path.basename(path)
    return os.sep + name if name in (".", "..") else ""


def one_file(first: str, second: str) -> bool:
    """Whether writing `first` writes `second`: the same real path (a symbolic link, even one to
    nothing yet, is written as its target) or, both existing, one file (a hard link)."""
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    return os.path.exists(first) and os.path.exists(second) and os.path.samefile(first, second)
