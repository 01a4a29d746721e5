"""Writing files so that a crash, a full disk or a kill never leaves half of one, and knowing
beforehand whether a folder can be written at all."""

from __future__ import annotations

import os
import pathlib
import tempfile


def write_text_atomically(path: str | pathlib.Path, text: str) -> None:
    """Writes through a temporary file and a rename, so a failure never leaves half a file."""
    path = pathlib.Path(path)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def unwritable_folder_reason(path: str | pathlib.Path) -> str | None:
    """Why files cannot be written under the folder `path` (created with its parents if missing),
    or None when they can: it is a file, something above it is a file, or the nearest existing
    folder refuses a new entry (tried with an empty folder, removed at once)."""
    path = pathlib.Path(path).absolute()
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".jaxformer-probe-", dir=existing))
    except OSError as error:
        return f"{existing} takes no new entries ({error.strerror})"
    return None
