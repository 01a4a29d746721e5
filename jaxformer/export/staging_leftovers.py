"""The hidden `.<output>.*.partial` staging folders of exports killed before they were in place
(SIGKILL, power loss), which no later export would otherwise remove. Each export holds a lock on
its own staging folder while it lives (released by the kernel when its process dies, however it
dies), so a later export to the same output tells a dead export's folder, removed with a warning,
from a live one's, left alone."""

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


def remove_dead(folder: pathlib.Path, output: pathlib.Path) -> None:
    """Removes, each with a warning, the staging folders for `output` in `folder` whose export is
    no longer alive (none holds its lock); a live export's is left as it is."""
    if not folder.is_dir():
        return
    for path in sorted(folder.glob(staging_pattern(output))):
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile, or not ours to read
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: an export to this output is running
                continue
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                logger.warning("cannot remove %s, left by an export to %s that was killed", path, output)
            else:
                logger.warning(
                    "removed %s, left by an export to %s that was killed before it was in place", path, output
                )
        finally:
            os.close(descriptor)
