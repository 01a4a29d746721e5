"""Reading parallel text, a pair of line-aligned files or one TSV file (gzip or plain), with errors
that name the place."""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import itertools
import logging
import pathlib
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence

from jaxformer.data.tsv_quoting import QuotingCheck, quoted_break
from jaxformer.data.unmarked_wide_text import HEAD_BYTES, unmarked_wide_encoding
from jaxformer.errors import UserError

logger = logging.getLogger(__name__)


class DataError(UserError, ValueError):
    """Bad input data; the message names the file and, where there is one, the line."""


@dataclasses.dataclass
class SkipCounter:
    """How many pairs were skipped because one side was empty, and where the first was. With
    `report` off the reader logs nothing: its caller (evaluate) leaves out more pairs, those with
    a side the tokenizer encodes to no piece, and reports them all in one warning."""

    empty: int = 0
    first_empty: str | None = None
    report: bool = True


def skipped_pairs_text(count: int, where: str, first: str, sides: int = 2) -> str:
    """The one wording of the warning for pairs left out for an empty side, whoever leaves them out:
    this reader (a side with no text), evaluate and the training pipeline (also a side that the
    tokenizer encodes to no piece: zero-width spaces or control characters alone); for one
    language's text (`sides` 1), lines without text."""
    plural = "" if count == 1 else "s"
    what = f"pair{plural} with an empty side" if sides == 2 else f"line{plural} without text"
    return f"skipped {count:,} {what} in {where} (first at {first})"


# Magic bytes of the compressed formats corpora come in that are not read (gzip is): without them
# such a file reads as "line 1 is not valid UTF-8", or as "not a gzip file" when named .gz.
# bzip2's "BZh" is followed by the block size and a block's magic, or the empty stream's.
_OTHER_COMPRESSIONS = {
    "xz": re.compile(rb"\xfd7zXZ\x00"),
    "bzip2": re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"),
    "zstd": re.compile(rb"\x28\xb5\x2f\xfd"),
}
MAGIC_BYTES = 10  # the most any of them needs


def _first_match(patterns: dict[str, re.Pattern], head: bytes) -> str | None:
    """The name of the first of `patterns` that `head`, a file's first bytes, starts with."""
    return next((name for name, pattern in patterns.items() if pattern.match(head)), None)


def other_compression(head: bytes) -> str | None:
    """The phrase "is xz compressed, but ..." for a file whose first bytes, `head` (at least
    MAGIC_BYTES of them, where the file has them), are those of xz, bzip2 or zstd; else None."""
    compression = _first_match(_OTHER_COMPRESSIONS, head)
    if compression is None:
        return None
    return (
        f"is {compression} compressed, but only gzip (.gz) and plain text are read: decompress it "
        f"({compression} -d), or recompress it with gzip"
    )


# A plain file's first bytes that say it holds no UTF-8 text, which would read as "line 1 is not
# valid UTF-8": gzip data under a name without .gz, or UTF-16/32 text (as Excel's "Unicode text"
# export writes) by its byte-order mark. None of them starts valid UTF-8. UTF-32's marks first:
# UTF-32-LE's starts as UTF-16-LE's does.
_GZIP_MAGIC = b"\x1f\x8b"
_OTHER_ENCODINGS = {
    encoding: re.compile(b"|".join(re.escape(mark) for mark in marks))
    for encoding, marks in (
        ("UTF-32", (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)),
        ("UTF-16", (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)),
    )
}


def not_utf8_text(head: bytes) -> str | None:
    """The phrase "holds gzip compressed data ..." or "is UTF-16 text ..." for a file read as plain
    text whose first bytes, `head`, are gzip's magic or a UTF-16/32 byte-order mark, or UTF-16/32
    text without one (`unmarked_wide_encoding`: `head` is then the file's first HEAD_BYTES); else None."""
    if head.startswith(_GZIP_MAGIC):
        return (
            "holds gzip compressed data where text should be (only a file named *.gz is decompressed, once): "
            "decompress it (gunzip), or give it as a file named *.gz"
        )
    encoding = _first_match(_OTHER_ENCODINGS, head)
    if encoding is not None:
        return (
            f"is {encoding} text (its byte-order mark says so), but text is read as UTF-8: "
            f"convert it (iconv -f {encoding} -t UTF-8)"
        )
    unmarked = unmarked_wide_encoding(head)
    if unmarked is None:
        return None
    encoding, line = unmarked
    return (
        f"looks like {encoding} text without a byte-order mark (its first line so read: {line[:40]!r}), "
        f"but text is read as UTF-8: convert it (iconv -f {encoding} -t UTF-8)"
    )


def _open_text(path: pathlib.Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def first_line(path: str | pathlib.Path) -> str:
    """The first line of a text file (gzip or plain) as text, without its line break or a
    byte-order mark; bytes that are not UTF-8 replaced (reading the file names them)."""
    with _open_text(pathlib.Path(path)) as handle:
        return handle.readline().decode("utf-8-sig", errors="replace").rstrip("\r\n")


def decode_lines(raw_lines: Iterable[bytes], name: str | pathlib.Path) -> list[str]:
    """UTF-8 lines without their line breaks, and without the byte-order mark that some editors
    write at the start of a file (it is not text: a reference that kept it would lose BLEU), nor
    one at the start of a later line (files joined with cat, each with its own mark); a
    bad byte raises DataError naming `name` and the line. Lines ended by a carriage return alone
    are named first: they make every line number 1 (the bad byte's line once converted is named with them)."""
    head, raw_lines = _head_of(raw_lines)
    unread_format = other_compression(head) or not_utf8_text(head)
    if unread_format:
        raise DataError(f"{name} {unread_format}")
    lines, count, carriage_returns, breaks, not_utf8 = [], 0, 0, 0, None
    for count, raw in enumerate(raw_lines, start=1):
        if not_utf8 is None:  # read on past it only to count the line endings
            try:
                text = raw.decode("utf-8-sig" if count == 1 else "utf-8").rstrip("\r\n")
                lines.append(text.removeprefix("\ufeff"))  # a later line's mark too: files joined with cat
            except UnicodeDecodeError as error:
                bom = len(codecs.BOM_UTF8) if count == 1 and raw.startswith(codecs.BOM_UTF8) else 0
                converted_line = breaks + raw[: bom + error.start].count(b"\r") + 1  # each \r and \n a break
                not_utf8 = (count, converted_line, error)
        carriage_returns += raw.rstrip(b"\r\n").count(b"\r")  # 0x0D is no part of another UTF-8 character
        carriage_returns += raw.endswith(b"\r")  # the last line's, with no \n after it: ended by \r alone
        breaks += raw.count(b"\r") + raw.count(b"\n")
    # Lines ended by \r alone read as one line holding them all; a stray \r in a line is text.
    if carriage_returns >= max(2, 2 * count):
        either = f" (then line {not_utf8[1]} is not valid UTF-8 either: {not_utf8[2].reason})" if not_utf8 else ""
        raise DataError(
            f"{name}: its {count} line(s) hold {carriage_returns} carriage returns (\\r), as lines ended by \\r "
            f"alone (classic Mac OS) read; lines here end in \\n: convert them, e.g. with tr '\\r' '\\n'{either}"
        )
    if not_utf8:
        number, _, error = not_utf8
        raise DataError(f"{name}: line {number} is not valid UTF-8 ({error.reason} at byte {error.start})")
    return lines


def _head_of(raw_lines: Iterable[bytes]) -> tuple[bytes, Iterator[bytes]]:
    """The first HEAD_BYTES bytes of `raw_lines`, over as many lines as they take (UTF-16LE's line
    break 0A 00 splits as a UTF-8 one and a NUL starting the next line), and all the lines again."""
    lines, first, size = iter(raw_lines), [], 0
    for raw in lines:
        first.append(raw)
        size += len(raw)
        if size >= HEAD_BYTES:
            break
    return b"".join(first)[:HEAD_BYTES], itertools.chain(first, lines)


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
    yield from _with_text_on_every_side(
        zip(source_lines, target_lines),
        skipped,
        lambda number, source_empty: f"{source_path if source_empty else target_path}:{number}",
        f"{source_path} / {target_path}",
    )


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
    yield from _with_text_on_every_side(rows, skipped, lambda number, _: f"{path}:{number}", str(path))


def read_tsv_column(
    path: str | pathlib.Path, column: int, skipped: SkipCounter | None = None
) -> Iterator[tuple[int, str]]:
    """Yields (line number, text), 1-based, of column `column` (0 source, 1 target) of a
    `source<TAB>target` file, for every line with text there: `read_tsv_pairs`'s checks of every
    line (the quoting of the column read alone), for a language model that reads one side. Lines
    without text there are skipped as there."""
    path = pathlib.Path(path)
    texts = [(fields[column],) for fields in _tsv_fields(path, (column,))]
    yield from _with_text_on_every_side(texts, skipped, lambda number, _: f"{path}:{number}", str(path))


def read_sentences(path: str | pathlib.Path, skipped: SkipCounter | None = None) -> Iterator[tuple[int, str]]:
    """Yields (line number, text), 1-based, of every line with text of a text file of one
    sentence per line (gzip or plain); lines without text are skipped, counted in `skipped` and
    logged once at the end."""
    path = pathlib.Path(path)
    lines = [(line,) for line in read_lines(path)]
    yield from _with_text_on_every_side(lines, skipped, lambda number, _: f"{path}:{number}", str(path))


def _tsv_fields(path: pathlib.Path, columns: Sequence[int]) -> list[list[str]]:
    """The [source, target] fields of each line; DataError naming the line without one tab (and the
    CSV-quoted text with a tab or line break that made it so), or the text of `columns` (the fields
    read) that a CSV writer quoted."""
    pairs, quoting, lines = [], QuotingCheck(path, columns), read_lines(path)
    for number, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) == 1 and not line.strip():  # a blank line (many files end in one): no text, no tab
            fields = ["", ""]
        if len(fields) != 2:
            because = quoted_break(lines, number)
            raise DataError(
                f"{path}: line {number} has {len(fields) - 1} tabs; each line must be source<TAB>target, with one tab"
                + (f", but {because}" if because else "")
            )
        quoted = quoting.line(number, fields)
        if quoted:
            raise DataError(quoted)
        pairs.append(fields)
    quoted = quoting.end()
    if quoted:
        raise DataError(quoted)
    return pairs


def _with_text_on_every_side(
    rows: Iterable[Sequence[str]], skipped: SkipCounter | None, place: Callable[[int, bool], str], where: str
) -> Iterator[tuple]:
    """(line number, *texts), stripped, of the rows (pairs, or one language's lines) with text on
    every side; the others are counted in `skipped` (`place(number, first side empty)` names the
    first) and logged once (unless `skipped.report` is off)."""
    skipped = SkipCounter() if skipped is None else skipped
    sides = 2
    for number, row in enumerate(rows, start=1):
        texts = tuple(text.strip() for text in row)
        sides = len(texts)
        if not all(texts):
            skipped.empty += 1
            skipped.first_empty = skipped.first_empty or place(number, not texts[0])
            continue
        yield number, *texts
    if skipped.empty and skipped.report:
        logger.warning("%s", skipped_pairs_text(skipped.empty, where, skipped.first_empty, sides))
