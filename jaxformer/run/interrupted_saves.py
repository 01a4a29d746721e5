"""What a process killed while saving a checkpoint leaves in a folder of step directories, and
how the next writer of that folder puts it right.

A step written again (best/, averaged/ or final/ at a step it already holds) is replaced in
three moves: the whole previous version is renamed `<step>.replacing`, orbax writes the new one
(in `<step>.orbax-checkpoint-tmp*`, renamed `<step>` once whole), and `<step>.replacing` becomes
`<step>.replaced-<time>`. A kill between them leaves `<step>.replacing`: with no `<step>` it is
the last whole version, which the next writer renames back; beside a new `<step>` it was
replaced, and is set aside as any replaced one. Orbax's `*.orbax-checkpoint-tmp*` folders that a
kill leaves (an interim checkpoint a stopped run was writing, say, whose step is never saved
again) are never readable: the next writer removes them. Only a writer that no other live
process writes beside calls these (the training run holding the workdir lock; average_checkpoints
for averaged/); readers only name what they find.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import time

logger = logging.getLogger(__name__)

REPLACING = "replacing"
PARTIAL_SAVE_MARK = ".orbax-checkpoint-tmp"  # in the names of orbax's folders of unfinished saves
SET_ASIDE_WARNINGS = {
    "damaged": "moved the damaged checkpoint of step %d to %s",
    "replaced": "moved the previous checkpoint of step %d to %s: a new one replaces it",
}


def replacing_path(directory: pathlib.Path, step: int) -> pathlib.Path:
    """Where the whole previous version of `step` waits while a new one is written."""
    return directory / f"{step}.{REPLACING}"


def set_aside_path(directory: pathlib.Path, step: int, reason: str) -> pathlib.Path:
    """A free `<step>.<reason>-<time>` name in `directory`."""
    stem = f"{step}.{reason}-{time.strftime('%Y%m%d-%H%M%S')}"
    target, copy = directory / stem, 1
    while target.exists():  # set aside twice within a second
        copy += 1
        target = directory / f"{stem}-{copy}"
    return target


def interrupted_replacements(directory: pathlib.Path) -> dict[int, pathlib.Path]:
    """{step: its `<step>.replacing`} for the steps whose replacement was interrupted before the
    new version was whole (no `<step>` beside it)."""
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.glob(f"*.{REPLACING}"):
        step = path.name.partition(".")[0]
        if step.isdigit() and not (directory / step).exists():
            found[int(step)] = path
    return found


def interrupted_replacement_note(directory: pathlib.Path) -> str:
    """For a reader's refusal: the whole previous versions waiting in `directory`, and the remedy."""
    kept = interrupted_replacements(directory)
    if not kept:
        return ""
    names = ", ".join(str(path) for _, path in sorted(kept.items()))
    return (
        f"; a save replacing a checkpoint was interrupted: {names} holds its previous version, whole, which the "
        "command that writes this folder (average_checkpoints for averaged/, the run's training command for best/ "
        "and final/) puts back when run again"
    )


def finish_interrupted_saves(directory: pathlib.Path) -> None:
    """Puts back each interrupted replacement's previous version (or sets it aside when the new one
    is whole), and removes orbax's partial saves, each with a warning naming it."""
    if not directory.is_dir():
        return
    for path in sorted(directory.glob(f"*.{REPLACING}")):
        step = path.name.partition(".")[0]
        if not step.isdigit():
            continue
        if (directory / step).exists():
            target = set_aside_path(directory, int(step), "replaced")
            path.rename(target)
            logger.warning(SET_ASIDE_WARNINGS["replaced"], int(step), target)
        else:
            path.rename(directory / step)
            logger.warning(
                "put back checkpoint %s from %s: the save that was replacing it was interrupted",
                directory / step,
                path,
            )
    partial = sorted(path for path in directory.iterdir() if PARTIAL_SAVE_MARK in path.name)
    for path in partial:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if partial:
        logger.warning(
            "removed the partial checkpoint save%s that an interrupted process left (never readable): %s",
            "s" if len(partial) > 1 else "",
            ", ".join(str(path) for path in partial),
        )
