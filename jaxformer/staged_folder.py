"""A folder written whole or not at all (jaxformer-export's output, jaxformer-convert's): staged in
a hidden folder beside it (inside it where it is a mount point, which no rename can replace),
then moved into place once complete: renamed whole, or a mount point's entries moved in one by
one, the entry that makes it readable (`Writer.last`) moved out of a folder it replaces first and
in last, so a crash between those moves leaves nothing readable, never a mixed folder. A move
that fails undoes those before it; SIGTERM and SIGINT wait for the moves to end. A staging folder
is locked while its writer lives: a kill -9 leaves it to the next writer (staging_leftovers.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import pathlib
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator

from jaxformer import staging_leftovers
from jaxformer.deferred_signals import signals_deferred
from jaxformer.files import is_mount_point, unwritable_folder_reason


@dataclasses.dataclass(frozen=True)
class Writer:
    """Who writes the folder: the noun its messages name it by ("export"), the exception its
    one-line errors are, and the entry that makes the folder readable (None: any order)."""

    noun: str
    error: type[Exception]
    last: str | None = None


def staged_inside(output: pathlib.Path) -> bool:
    """Whether the folder is staged inside `output` and its entries moved in: a mount point cannot
    be renamed or replaced (EBUSY), nor can anything be renamed into it from outside (EXDEV)."""
    return output.is_dir() and is_mount_point(output)


def staging_folder(output: pathlib.Path) -> pathlib.Path:
    """Where the folder for `output` is staged, and its killed writers' leftovers are."""
    return output if staged_inside(output) else output.parent


def remove_dead_leftovers(output: pathlib.Path, writer: Writer) -> list[pathlib.Path]:
    """The staging folders of killed writes to `output` removed, and the folder one was replacing
    put back or removed, each with a warning (staging_leftovers.py); a live writer's left alone.
    Called before the output is checked: a leftover inside a mount point would make it look in use.
    Returns the killed writes' staging folders that were inside `output` (a mount point): such a
    write moved its entries in one by one, so what `output` holds besides may be the part of its
    folder it moved in before it was killed."""
    folder = staging_folder(output)
    killed = staging_leftovers.remove_dead(folder, output, writer.noun)
    return killed if folder == output else []


def check_placeable(output: pathlib.Path, writer: Writer) -> None:
    """`writer.error` where `output` could not be renamed into place: it holds the current folder
    (which the rename would take from under the shell), or where it is staged takes no new entries."""
    try:
        current = pathlib.Path.cwd().resolve()
    except FileNotFoundError:  # a removed folder: it holds no output, and the output is absolute
        current = None
    resolved = output.resolve()
    if current is not None and (resolved == current or resolved in current.parents):
        raise writer.error(
            f"--output {output}: holds the current folder: the {writer.noun} is renamed into place, which would "
            "take the folder from under this shell; give another folder, e.g. a new one inside it"
        )
    folder = staging_folder(output)
    unwritable = unwritable_folder_reason(folder)
    if unwritable:
        # The reason names the folder, or the thing above it that is no folder, except where the
        # folder itself is a file or a link to nothing (was: "/proc: /proc takes no new entries").
        where = f"{folder}: " if os.path.lexists(folder) and not folder.is_dir() else ""
        raise writer.error(f"--output {output}: cannot write it: {where}{unwritable}")


@contextlib.contextmanager
def staging_directory(output: pathlib.Path, writer: Writer) -> Iterator[pathlib.Path]:
    """A new directory beside `output` (on the same file system, so it can be renamed into
    place), or inside it where it is a mount point; removed if the write fails."""
    staging = None
    try:
        # A signal while it is made is raised once `staging` names it, so that it is removed too.
        with signals_deferred():
            try:
                output.parent.mkdir(parents=True, exist_ok=True)
                staging = pathlib.Path(
                    tempfile.mkdtemp(dir=staging_folder(output), prefix=f".{output.name}.", suffix=".partial")
                )
            except OSError as error:
                raise writer.error(
                    f"--output {output}: cannot write the {writer.noun} beside it: {error.strerror or error}"
                ) from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's is private to its owner; the output is not
        with staging_leftovers.held(staging):
            yield staging
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)  # gone already once moved into place


def raise_held_signal() -> None:
    """A signal that the handler in place holds (a command's RaiseOnSignal holds one that came
    inside JAX's, torch's or orbax's code) stops the write here, before it is put in place, not after."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        holder = getattr(signal.getsignal(signum), "__self__", None)
        if callable(getattr(holder, "check", None)):
            holder.check()
            return


def move_into_place(
    staging: pathlib.Path, output: pathlib.Path, writer: Writer, on_placed: Callable[[], None] | None = None
) -> None:
    """Renames `staging` to `output`, the folder there (which the writer's checks let through) moved
    aside first and removed once the new one is in place. A `staging` inside `output` (a mount
    point) has its entries moved in instead, the old folder's `writer.last` out first and the new
    one's in last. A rename that fails undoes those before it: the old folder stays in place and
    nothing is left beside it. `on_placed()` is called once it is in place, before a signal that
    came meanwhile is raised again."""
    # A signal between the renames would leave the old folder hidden beside an absent output, and
    # its handler would then delete the new one with the staging directory.
    with signals_deferred(), contextlib.ExitStack() as old_held:
        old = [entry for entry in output.iterdir() if entry != staging] if output.is_dir() else []
        retired, placed = None, False
        try:
            if old:
                retired = pathlib.Path(tempfile.mkdtemp(dir=staging.parent, prefix=f".{output.name}.", suffix=".old"))
                # Locked while this writer lives (the folder renamed to `retired`, or the one the old
                # entries move to): a kill -9 leaves it to the next writer (staging_leftovers).
                old_held.enter_context(staging_leftovers.held(retired if staging.parent == output else output))
            if staging.parent == output:
                new_last = sorted(staging.iterdir(), key=lambda entry: entry.name == writer.last)
                old_first = sorted(old, key=lambda entry: entry.name != writer.last)
                moves = [(entry, retired / entry.name) for entry in old_first]
                moves += [(entry, output / entry.name) for entry in new_last]
            else:
                moves = [(output, retired)] if old else []
                moves += [(staging, output)]  # onto an absent output, or an empty directory (which rename replaces)
            _rename_all(moves)
            placed = True
        except OSError as error:
            raise writer.error(_move_failure(output, error, retired, writer.noun)) from None
        finally:
            if retired is not None and placed:
                shutil.rmtree(retired, ignore_errors=True)
            elif retired is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(retired)  # empty (or gone) once the renames are undone
        if on_placed is not None:
            on_placed()


def _rename_all(moves: list[tuple[pathlib.Path, pathlib.Path]]) -> None:
    """Each (source, target) renamed in turn; if one fails, those done are renamed back, last first."""
    done = []
    try:
        for source, target in moves:
            os.replace(source, target)
            done.append((source, target))
    except OSError:
        for source, target in reversed(done):
            with contextlib.suppress(OSError):
                os.replace(target, source)
        raise


def _move_failure(output: pathlib.Path, error: OSError, retired: pathlib.Path | None, noun: str) -> str:
    """The one line saying that the folder could not be moved into `output`, and where the old one is
    if putting it back failed too."""
    message = f"cannot move the {noun} into {output}: {error.strerror or error}"
    if error.errno == errno.EBUSY:  # a mount point that is_mount_point did not see
        message += f" ({output} is in use, a mount point?): give a folder inside it, e.g. {output / noun}"
    if retired is not None and retired.exists() and any(retired.iterdir()):
        message += f"; the previous {noun} is in {retired}"
    return message
