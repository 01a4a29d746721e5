"""Writing files so that a crash, a full disk or a kill never leaves half of one."""

from __future__ import annotations

import pathlib


def write_text_atomically(path: str | pathlib.Path, text: str) -> None:
    """Writes through a temporary file and a rename, so a failure never leaves half a file."""
    path = pathlib.Path(path)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
