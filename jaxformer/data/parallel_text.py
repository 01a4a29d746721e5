"""Reading a pair of line-aligned text files (gzip or plain) with errors that name the place."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import pathlib
from collections.abc import Iterable, Iterator

from jaxformer.errors import UserError


class DataError(UserError, ValueError):
    """Bad input data; the message names the file and, where there is one, the line."""


@dataclasses.dataclass
class SkipCounter:
    """How many pairs were skipped because one side was empty, and where the first was."""

    empty: int = 0
    first_empty: str | None = None


def _open_text(path: pathlib.Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def decode_lines(raw_lines: Iterable[bytes], name: str | pathlib.Path) -> list[str]:
    """UTF-8 lines without their line breaks; a bad byte raises DataError naming `name` and the line."""
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as error:
            raise DataError(
                f"{name}: line {number} is not valid UTF-8 ({error.reason} at byte {error.start})"
            ) from None
    return lines


def read_lines(path: str | pathlib.Path) -> list[str]:
    """The lines of a text file, gzip or plain."""
    path = pathlib.Path(path)
    with _open_text(path) as handle:
        return decode_lines(handle, path)


def read_parallel_lines(
    source_path: str | pathlib.Path, target_path: str | pathlib.Path, skipped: SkipCounter | None = None
) -> Iterator[tuple[int, str, str]]:
    """Yields (line number, source line, target line), 1-based, for every pair with text on both sides.

    Raises `DataError` when the files differ in line count or hold a line that is not UTF-8.
    Pairs with an empty side are skipped, counted in `skipped` and logged once at the end.
    """
    source_path, target_path = pathlib.Path(source_path), pathlib.Path(target_path)
    source_lines, target_lines = read_lines(source_path), read_lines(target_path)
    if len(source_lines) != len(target_lines):
        raise DataError(
            f"line counts differ: {source_path} has {len(source_lines)} lines, "
            f"{target_path} has {len(target_lines)}; line N of one must translate line N of the other"
        )
    skipped = SkipCounter() if skipped is None else skipped
    for number, (source, target) in enumerate(zip(source_lines, target_lines), start=1):
        if not source.strip() or not target.strip():
            skipped.empty += 1
            skipped.first_empty = (
                skipped.first_empty or f"{source_path if not source.strip() else target_path}:{number}"
            )
            continue
        yield number, source.strip(), target.strip()
    if skipped.empty:
        logging.warning(
            "skipped %d pairs with an empty side in %s / %s (first at %s)",
            skipped.empty,
            source_path,
            target_path,
            skipped.first_empty,
        )
