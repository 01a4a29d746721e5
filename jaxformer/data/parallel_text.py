"""Reading parallel text, a pair of line-aligned files or one TSV file (gzip or plain), with errors
that name the place."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import pathlib
import zlib
from collections.abc import Iterable, Iterator, Sequence

from jaxformer.data import text_lines
from jaxformer.data.text_lines import MAGIC_BYTES, other_compression
from jaxformer.data.tsv_quoting import QuotingCheck, quoted_break, spanning_pair
from jaxformer.errors import UserError

logger = logging.getLogger(__name__)


class DataError(UserError, ValueError):
    """Bad input data; the message names the file and, where there is one, the line."""


@dataclasses.dataclass
class SkipCounter:
    """How many pairs were skipped because one side was empty, and where the first was. With
    `report` off the reader logs nothing: its caller (evaluate) leaves out more pairs, those with
    a side the tokenizer encodes to no piece or that shows nothing, and reports them all in one warning."""

    empty: int = 0
    first_empty: str | None = None  # "path:line" of the first
    report: bool = True
    first_line: int | None = None  # the first's line, and its file's place among the reader's files
    first_file: int = 0


def skipped_pairs_text(count: int, where: str, first: str, sides: int = 2) -> str:
    """The one wording of the warning for pairs left out for an empty side, whoever leaves them out:
    this reader (a side with no text), evaluate and the training pipeline (also a side that the
    tokenizer encodes to no piece or that shows nothing: zero-width spaces, joiners or control
    characters alone); for one language's text (`sides` 1), lines without text."""
    plural = "" if count == 1 else "s"
    what = f"pair{plural} with an empty side" if sides == 2 else f"line{plural} without text"
    return f"skipped {count:,} {what} in {where} (first at {first})"


def skipped_in_files(
    paths: Sequence[str | pathlib.Path], count: int, first_line: int, first_file: int, sides: int
) -> str:
    """The warning of a reader of `paths` (one file, or a pair's source and target files) that
    skipped `count` rows for an empty side, the first at `first_line` of `paths[first_file]`: as
    the reader says it, and as a reuse of the data it prepared says it again."""
    where = " / ".join(str(path) for path in paths)
    return skipped_pairs_text(count, where, f"{paths[first_file]}:{first_line}", sides)


def _open_text(path: pathlib.Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def first_line(path: str | pathlib.Path) -> str:
    """The first line of a text file (gzip or plain) as text, without its line break or a
    byte-order mark; bytes that are not UTF-8 replaced (reading the file names them)."""
    with _open_text(pathlib.Path(path)) as handle:
        return handle.readline().decode("utf-8-sig", errors="replace").rstrip("\r\n")


def decode_lines(raw_lines: Iterable[bytes], name: str | pathlib.Path) -> list[str]:
    """text_lines.decode_lines: the UTF-8 lines, or DataError naming `name` and the line."""
    try:
        return text_lines.decode_lines(raw_lines, name)
    except text_lines.TextError as error:
        raise DataError(str(error)) from None


def read_lines(path: str | pathlib.Path) -> list[str]:
    """The lines of a text file, gzip or plain; DataError naming it when it cannot be read."""
    path = pathlib.Path(path)
    try:
        with _open_text(path) as handle:
            return decode_lines(handle, path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        with open(path, "rb") as handle:
            head = handle.read(MAGIC_BYTES)
        compression = other_compression(head)
        if compression:  # xz, bzip2 or zstd named .gz
            raise DataError(f"{path} {compression}") from None
        if head[:2] != b"\x1f\x8b":  # not gzip's magic bytes (a damaged or cut download has them): plain text
            raise DataError(f"{path}: not a gzip file ({error}); rename it without .gz if it is plain text") from None
        raise DataError(f"{path}: not a complete gzip file ({error})") from None
    except OSError as error:  # after the gzip errors above, which are OSErrors too
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None


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
    yield from _with_text_on_every_side(zip(source_lines, target_lines), skipped, (source_path, target_path))


def read_tsv_pairs(path: str | pathlib.Path, skipped: SkipCounter | None = None) -> Iterator[tuple[int, str, str]]:
    """Yields (line number, source, target), 1-based, from a `source<TAB>target` file (gzip or plain),
    for every pair with text on both sides.

    Raises `DataError` naming the file and line for a line of text without exactly one tab or one
    that is not UTF-8, and for text that a CSV writer quoted (`tsv_quoting`). Pairs with an empty
    side are skipped, counted in `skipped` and logged once at the end; a blank line is such a pair,
    as a blank line of both {lang} files is.
    """
    path = pathlib.Path(path)
    rows = _tsv_fields(path, (0, 1))
    yield from _with_text_on_every_side(rows, skipped, (path,))


def read_tsv_column(
    path: str | pathlib.Path, column: int, skipped: SkipCounter | None = None
) -> Iterator[tuple[int, str]]:
    """Yields (line number, text), 1-based, of column `column` (0 source, 1 target) of a
    `source<TAB>target` file, for every line with text there: `read_tsv_pairs`'s checks of every
    line (the quoting of the column read alone), for a language model that reads one side. Lines
    without text there are skipped as there."""
    path = pathlib.Path(path)
    texts = [(fields[column],) for fields in _tsv_fields(path, (column,))]
    yield from _with_text_on_every_side(texts, skipped, (path,))


def read_sentences(path: str | pathlib.Path, skipped: SkipCounter | None = None) -> Iterator[tuple[int, str]]:
    """Yields (line number, text), 1-based, of every line with text of a text file of one
    sentence per line (gzip or plain); lines without text are skipped, counted in `skipped` and
    logged once at the end."""
    path = pathlib.Path(path)
    lines = [(line,) for line in read_lines(path)]
    yield from _with_text_on_every_side(lines, skipped, (path,))


def _tsv_fields(path: pathlib.Path, columns: Sequence[int]) -> list[list[str]]:
    """The [source, target] fields of each line; DataError naming the line without one tab (and the
    CSV-quoted text with a tab or line break that made it so), the lines of a CSV-quoted text with
    both that each have one tab (read as a pair each, in either column), or the text of `columns`
    (the fields read) that a CSV writer quoted."""
    pairs, quoting, lines = [], QuotingCheck(path, columns), read_lines(path)
    spanning_start, spanning = spanning_pair(lines) or (None, None)
    for number, line in enumerate(lines, start=1):
        # A text's mark too, not only a line's: files that each start with one, joined with paste.
        fields = [field.removeprefix("\ufeff") for field in line.split("\t")]
        if len(fields) == 1 and not line.strip():  # a blank line (many files end in one): no text, no tab
            fields = ["", ""]
        if len(fields) != 2:
            because = quoted_break(lines, number)
            raise DataError(
                f"{path}: line {number} has {len(fields) - 1} tabs; each line must be source<TAB>target, with one tab"
                + (f", but {because}" if because else "")
            )
        if number == spanning_start:
            raise DataError(f"{path}: {spanning}")
        quoted = quoting.line(number, fields)
        if quoted:
            raise DataError(quoted)
        pairs.append(fields)
    quoted = quoting.end()
    if quoted:
        raise DataError(quoted)
    return pairs


def _with_text_on_every_side(
    rows: Iterable[Sequence[str]], skipped: SkipCounter | None, paths: Sequence[pathlib.Path]
) -> Iterator[tuple]:
    """(line number, *texts), stripped, of the rows (pairs, or one language's lines) with text on
    every side, read from `paths` (one file, or a pair's source and target files: the first
    skipped is named in the one whose side is empty); the others are counted in `skipped` and
    logged once (unless `skipped.report` is off)."""
    skipped = SkipCounter() if skipped is None else skipped
    sides = 2
    for number, row in enumerate(rows, start=1):
        texts = tuple(text.strip() for text in row)
        sides = len(texts)
        if not all(texts):
            skipped.empty += 1
            if skipped.first_line is None:
                skipped.first_line, skipped.first_file = number, 0 if len(paths) == 1 or not texts[0] else 1
                skipped.first_empty = f"{paths[skipped.first_file]}:{number}"
            continue
        yield number, *texts
    if skipped.empty and skipped.report:
        text = skipped_in_files(paths, skipped.empty, skipped.first_line, skipped.first_file, sides)
        logger.warning("%s", text)
