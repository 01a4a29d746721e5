"""The hidden `.<output>.*.partial` staging folders of writers (jaxformer-export, jaxformer-convert:
staged_folder.py) killed before their folder was in place (SIGKILL, power loss), which no later
write would otherwise remove. Each writer holds a lock on its own staging folder while it lives
(released by the kernel when its process dies, however it dies), so a later write to the same
output tells a dead writer's folder, removed with a warning, from a live one's, left alone. So are
the `.<output>.*.old` folders that hold the folder a writer replaced (move_into_place locks it
while it lives): one killed between moving the old folder aside and putting the new one in place
left no output, the old one put back by the next write; one killed as it removed the old folder,
once the new one was in place, left it there, removed by the next write."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import shutil
from collections.abc import Iterator

from jaxformer.errors import with_article

logger = logging.getLogger(__name__)


def staging_pattern(output: pathlib.Path) -> str:
    """The names `tempfile.mkdtemp` gives the staging folders for `output`."""
    return f".{output.name}.*.partial"


@contextlib.contextmanager
def held(staging: pathlib.Path) -> Iterator[None]:
    """A lock on `staging` for as long as the writer that made it lives."""
    descriptor = os.open(staging, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder just made: no one else holds it
        yield
    finally:
        os.close(descriptor)


def retired_pattern(output: pathlib.Path) -> str:
    """The names `tempfile.mkdtemp` gives the folders holding the folder that a writer replaces."""
    return f".{output.name}.*.old"


@contextlib.contextmanager
def _of_a_dead_writer(path: pathlib.Path) -> Iterator[bool]:
    """Whether the folder at `path` is a dead writer's (none holds its lock; it is held, for this
    process, until the block ends); False for a live writer's, a link, or one gone meanwhile."""
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
        except OSError:  # held: a write to this output is running
            yield False
        else:
            yield True
    finally:
        os.close(descriptor)


def remove_dead(folder: pathlib.Path, output: pathlib.Path, noun: str) -> list[pathlib.Path]:
    """Removes, each with a warning naming the writer by `noun` ("export"), the staging folders for
    `output` in `folder` whose writer is no longer alive (none holds its lock); a live writer's is
    left as it is. Then the old folder a dead writer was replacing: put back where no output is,
    else removed (`_retired_left`). Returns the dead writers' staging folders, each a write to
    `output` killed before its folder was whole in place."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob(staging_pattern(output))):
        with _of_a_dead_writer(path) as dead:
            if not dead:
                continue
            found.append(path)
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                logger.warning("cannot remove %s, left by %s to %s that was killed", path, with_article(noun), output)
            else:
                logger.warning(
                    "removed %s, left by %s to %s that was killed before it was in place",
                    path,
                    with_article(noun),
                    output,
                )
    for path in sorted(folder.glob(retired_pattern(output))):
        with _of_a_dead_writer(path) as dead:
            if dead:
                _retired_left(path, output, folder, noun)
    return found


def _retired_left(path: pathlib.Path, output: pathlib.Path, folder: pathlib.Path, noun: str) -> None:
    """The old folder in `path`, of a write to `output` killed as it replaced it: renamed back to
    `output` where there is none (killed between the two renames; a folder is in place whole or
    not at all), else removed (killed as it removed it, the new one in place). Inside `output` (a
    mount point, its entries moved one by one) it is named, for you to sort out."""
    if folder == output:
        logger.warning(
            "kept %s, the previous %s in %s, left by %s killed as it replaced it; move what you "
            "need of it back, then delete it",
            path,
            noun,
            output,
            with_article(noun),
        )
    elif not output.exists() and not output.is_symlink():
        path.rename(output)
        logger.warning(
            "put back the previous %s in %s from %s: the %s replacing it was killed before it was in place",
            noun,
            output,
            path,
            noun,
        )
    else:
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            logger.warning(
                "cannot remove %s, the previous %s in %s, left by %s that was killed",
                path,
                noun,
                output,
                with_article(noun),
            )
        else:
            logger.warning(
                "removed %s, the previous %s in %s, left by %s killed once its own was in place",
                path,
                noun,
                output,
                with_article(noun),
            )
