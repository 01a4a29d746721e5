"""An export's output folder: checked before any work (absent, empty, or with `overwrite` an
export and nothing else), the export staged beside it (inside it where it is a mount point, which
no rename can replace), and moved into place once complete and read back: renamed whole, or a mount
point's entries moved in one by one, the old export's config.json out first and the new one's in
last, so a crash between those moves leaves no loadable export, never a mixed one. A move that
fails undoes those before it; SIGTERM and SIGINT wait for the moves to end."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator

from jaxformer.export import staging_leftovers, standalone
from jaxformer.export.loading import ExportError
from jaxformer.files import is_mount_point, unwritable_folder_reason


def _export_files(directory: pathlib.Path) -> set[str] | None:
    """The names of the files the export in `directory` consists of (those its config.json lists,
    and itself), or None if `directory` holds no export."""
    try:
        config = json.loads((directory / standalone.CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("format") != standalone.FORMAT:
        return None
    files = config.get("files") if isinstance(config.get("files"), dict) else {}
    loader = files.get("loader") if isinstance(files.get("loader"), dict) else {}
    imports = loader.get("imports") if isinstance(loader.get("imports"), list) else []
    entries = [*files.values(), *imports]
    names = [entry.get("name") if isinstance(entry, dict) else entry for entry in entries]
    return {name for name in names if isinstance(name, str)} | {standalone.CONFIG_FILE}


def staged_inside(output: pathlib.Path) -> bool:
    """Whether the export is staged inside `output` and its entries moved in: a mount point cannot
    be renamed or replaced (EBUSY), nor can anything be renamed into it from outside (EXDEV)."""
    return output.is_dir() and is_mount_point(output)


def check_output(output: pathlib.Path, overwrite: bool, staging: pathlib.Path | None = None) -> None:
    """`ExportError` unless `output` is absent, an empty directory, or (with `overwrite`) an export
    and nothing else, the export's own `staging` directory aside."""
    if output.is_symlink():  # the new export is renamed into place: it would replace the link, not fill its folder
        raise ExportError(f"--output {output}: is a symbolic link (to {os.readlink(output)}); give the folder itself")
    if output.exists() and not output.is_dir():
        raise ExportError(f"--output {output}: is a file, not a directory")
    try:
        current = pathlib.Path.cwd().resolve()
    except FileNotFoundError:  # a removed folder: it holds no output, and the output is absolute
        current = None
    resolved = output.resolve()
    if current is not None and (resolved == current or resolved in current.parents):
        raise ExportError(
            f"--output {output}: holds the current folder: the export is renamed into place, which would take the "
            "folder from under this shell; give another folder, e.g. ./export"
        )
    folder = output if staged_inside(output) else output.parent  # where the export is staged
    unwritable = unwritable_folder_reason(folder)
    if unwritable:
        where = "" if folder == output else f"{folder}: "  # the reason names the mount point already
        raise ExportError(f"--output {output}: cannot write it: {where}{unwritable}")
    entries = [path for path in output.iterdir() if path != staging] if output.is_dir() else []
    if not entries:
        return
    export_files = _export_files(output)
    if export_files is None:  # --overwrite would not replace it either: not named as the way out
        raise ExportError(
            f"--output {output}: holds something other than a jaxformer export (no readable "
            f"{standalone.CONFIG_FILE}); not replacing it, even with --overwrite: give a new or empty folder"
        )
    cache = output / "__pycache__"  # serve.py and its helper, compiled where they ran
    others = [path for path in entries if path.name not in export_files or not path.is_file()]
    if cache.is_dir():
        modules = {name.removesuffix(".py") for name in export_files if name.endswith(".py")}
        others.remove(cache)
        others += [path for path in cache.iterdir() if path.suffix != ".pyc" or path.name.split(".")[0] not in modules]
    if others:
        raise ExportError(
            f"--output {output}: holds {min(others)}, which is not part of the export in it; "
            "not replacing it, even with --overwrite (move it elsewhere first)"
        )
    if not overwrite:
        raise ExportError(f"--output {output}: is not empty; pass --overwrite to replace the export in it")


@contextlib.contextmanager
def staging_directory(output: pathlib.Path) -> Iterator[pathlib.Path]:
    """A new directory beside `output` (on the same file system, so it can be renamed into
    place), or inside it where it is a mount point; removed if the export fails."""
    staging = None
    try:
        # A signal while it is made is raised once `staging` names it, so that it is removed too.
        with _signals_deferred():
            try:
                output.parent.mkdir(parents=True, exist_ok=True)
                folder = output if staged_inside(output) else output.parent
                staging = pathlib.Path(tempfile.mkdtemp(dir=folder, prefix=f".{output.name}.", suffix=".partial"))
            except OSError as error:
                reason = error.strerror or error
                raise ExportError(f"--output {output}: cannot write the export beside it: {reason}") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's is private to its owner; an export is not
        with staging_leftovers.held(staging):
            yield staging
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)  # gone already once moved into place


def raise_held_signal() -> None:
    """A signal that the handler in place holds (the export command's RaiseOnSignal holds one that
    came inside JAX's code, which an export is mostly) stops the export here, before it is put in
    place, not after."""
    holder = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    if callable(getattr(holder, "check", None)):
        holder.check()


def move_into_place(staging: pathlib.Path, output: pathlib.Path, on_placed: Callable[[], None] | None = None) -> None:
    """Renames `staging` to `output`, the export there (which check_output let through) moved
    aside first and removed once the new one is in place. A `staging` inside `output` (a mount
    point) has its entries moved in instead, the old export's config.json out first and the new
    one's in last. A rename that fails undoes those before it: the old export stays in place and
    nothing is left beside it. `on_placed()` is called once it is in place, before a signal that
    came meanwhile is raised again."""
    # A signal between the renames would leave the old export hidden beside an absent output, and
    # its handler would then delete the new one with the staging directory.
    with _signals_deferred(), contextlib.ExitStack() as old_held:
        old = [entry for entry in output.iterdir() if entry != staging] if output.is_dir() else []
        retired, placed = None, False
        try:
            if old:
                retired = pathlib.Path(tempfile.mkdtemp(dir=staging.parent, prefix=f".{output.name}.", suffix=".old"))
                # Locked while this export lives (the folder renamed to `retired`, or the one the old
                # entries move to): a kill -9 leaves it to the next export (staging_leftovers).
                old_held.enter_context(staging_leftovers.held(retired if staging.parent == output else output))
            if staging.parent == output:
                config_last = sorted(staging.iterdir(), key=lambda entry: entry.name == standalone.CONFIG_FILE)
                config_first = sorted(old, key=lambda entry: entry.name != standalone.CONFIG_FILE)
                moves = [(entry, retired / entry.name) for entry in config_first]
                moves += [(entry, output / entry.name) for entry in config_last]
            else:
                moves = [(output, retired)] if old else []
                moves += [(staging, output)]  # onto an absent output, or an empty directory (which rename replaces)
            _rename_all(moves)
            placed = True
        except OSError as error:
            raise ExportError(_move_failure(output, error, retired)) from None
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


def _move_failure(output: pathlib.Path, error: OSError, retired: pathlib.Path | None) -> str:
    """The one line saying that the export could not be moved into `output`, and where the old one is
    if putting it back failed too."""
    message = f"cannot move the export into {output}: {error.strerror or error}"
    if error.errno == errno.EBUSY:  # a mount point that is_mount_point did not see
        message += f" ({output} is in use, a mount point?): give a folder inside it, e.g. {output / 'export'}"
    if retired is not None and retired.exists() and any(retired.iterdir()):
        message += f"; the previous export is in {retired}"
    return message


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT received inside are raised again on leaving, to the handlers then in
    place. (Blocking them would not do: another thread, jax's, would take them.) Outside the main
    thread signals are left alone."""
    received, previous = [], {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
        for signum in received:
            signal.raise_signal(signum)
