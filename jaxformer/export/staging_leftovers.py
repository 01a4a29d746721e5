"""The hidden `.<output>.*.partial` staging folders of exports killed before they were in place
(SIGKILL, power loss), which no later export would otherwise remove. Each export holds a lock on
its own staging folder while it lives (released by the kernel when its process dies, however it
dies), so a later export to the same output tells a dead export's folder, removed with a warning,
from a live one's, left alone. So are the `.<output>.*.old` folders that hold the export an
export replaced (move_into_place locks it while it lives): one killed between moving the old
export aside and putting the new one in place left no output, the old export put back by the next
export; one killed as it removed the old export, once the new one was in place, left it there,
removed by the next export."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import shutil
from collections.abc import Iterator

logger = logging.getLogger(__name__)


def staging_pattern(output: pathlib.Path) -> str:
    """The names `tempfile.mkdtemp` gives an export's staging folders for `output`."""
    return f".{output.name}.*.partial"


@contextlib.contextmanager
def held(staging: pathlib.Path) -> Iterator[None]:
    """A lock on `staging` for as long as the export that made it lives."""
    descriptor = os.open(staging, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder just made: no one else holds it
        yield
    finally:
        os.close(descriptor)


def retired_pattern(output: pathlib.Path) -> str:
    """The names `tempfile.mkdtemp` gives the folders holding the export that an export replaces."""
    return f".{output.name}.*.old"


@contextlib.contextmanager
def _of_a_dead_export(path: pathlib.Path) -> Iterator[bool]:
    """Whether the folder at `path` is a dead export's (none holds its lock; it is held, for this
    process, until the block ends); False for a live export's, a link, or one gone meanwhile."""
    if path.is_symlink() or not path.is_dir():
        yield False
        return
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        yield False  # gone meanwhile, or not ours to read
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: an export to this output is running
            yield False
        else:
            yield True
    finally:
        os.close(descriptor)


def remove_dead(folder: pathlib.Path, output: pathlib.Path) -> None:
    """Removes, each with a warning, the staging folders for `output` in `folder` whose export is
    no longer alive (none holds its lock); a live export's is left as it is. Then the old export a
    dead export was replacing: put back where no output is, else removed (`_retired_left`)."""
    if not folder.is_dir():
        return
    for path in sorted(folder.glob(staging_pattern(output))):
        with _of_a_dead_export(path) as dead:
            if not dead:
                continue
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                logger.warning("cannot remove %s, left by an export to %s that was killed", path, output)
            else:
                logger.warning(
                    "removed %s, left by an export to %s that was killed before it was in place", path, output
                )
    for path in sorted(folder.glob(retired_pattern(output))):
        with _of_a_dead_export(path) as dead:
            if dead:
                _retired_left(path, output, folder)


def _retired_left(path: pathlib.Path, output: pathlib.Path, folder: pathlib.Path) -> None:
    """The old export in `path`, of an export to `output` killed as it replaced it: renamed back to
    `output` where there is none (killed between the two renames; an export is in place whole or
    not at all), else removed (killed as it removed it, the new one in place). Inside `output` (a
    mount point, its entries moved one by one) it is named, for you to sort out."""
    if folder == output:
        logger.warning(
            "kept %s, the previous export in %s, left by an export killed as it replaced it; move what you "
            "need of it back, then delete it",
            path,
            output,
        )
    elif not output.exists() and not output.is_symlink():
        path.rename(output)
        logger.warning(
            "put back the previous export in %s from %s: the export replacing it was killed before it was in place",
            output,
            path,
        )
    else:
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            logger.warning(
                "cannot remove %s, the previous export in %s, left by an export that was killed", path, output
            )
        else:
            logger.warning(
                "removed %s, the previous export in %s, left by an export killed once its own was in place",
                path,
                output,
            )
