"""Reading an export from jaxformer: the standalone loader (serve.py), with jaxformer's errors."""

from __future__ import annotations

import os

from jaxformer.errors import UserError
from jaxformer.export import standalone


class ExportError(UserError, standalone.ExportError):
    """An export cannot be written, or read: a file is missing or damaged; the message names it."""


def load_export(
    directory: str | os.PathLike, batch_size: int | None = None, seed: int | None = None
) -> standalone.ExportedTranslator:
    """The export in `directory` (see jaxformer/export/standalone.py), translating with its
    program; `ExportError` naming the file that is missing or damaged. `seed`: a sampling export's
    (default: its config.json's)."""
    try:
        return standalone.load(directory, batch_size, seed)
    except standalone.ExportError as error:
        raise ExportError(str(error)) from error


def check_export(directory: str | os.PathLike) -> None:
    """Reads the export in `directory` as `load_export` does, whatever platforms its program is
    for; `ExportError` naming the file that is missing or damaged."""
    try:
        standalone.read_export(directory)
    except standalone.ExportError as error:
        raise ExportError(str(error)) from error
