"""A text stream's lines read as UTF-8, as every jaxformer reader of text reads them (a file, stdin):
the formats that are not UTF-8 text named by the stream's first bytes (gzip, xz, bzip2 or zstd data,
UTF-16/32 text with a byte-order mark or without one), lines ended by \\r alone, and the first line
that is not UTF-8. Standard library only: `jaxformer-export` copies this module beside serve.py
(jaxformer/export/standalone.py), which reads stdin with it as translate.py does."""

from __future__ import annotations

import codecs
import itertools
import pathlib
import re
from collections.abc import Iterable, Iterator

if __package__:  # jaxformer.data.text_lines; an export's copy is given it by serve.py (`_import_beside`)
    from jaxformer.data import unmarked_wide_text


class TextError(ValueError):
    """A text stream that is not UTF-8 text; the message names it and, where there is one, its line."""


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
    unmarked = unmarked_wide_text.unmarked_wide_encoding(head)
    if unmarked is None:
        return None
    encoding, line = unmarked
    return (
        f"looks like {encoding} text without a byte-order mark (its first line so read: {line[:40]!r}), "
        f"but text is read as UTF-8: convert it (iconv -f {encoding} -t UTF-8)"
    )


def decode_lines(raw_lines: Iterable[bytes], name: str | pathlib.Path) -> list[str]:
    """UTF-8 lines without their line breaks, and without the byte-order mark that some editors
    write at the start of a file (it is not text: a reference that kept it would lose BLEU), nor
    one at the start of a later line (files joined with cat, each with its own mark); a
    bad byte raises TextError naming `name` and the line. Lines ended by a carriage return alone
    are named first: they make every line number 1 (the bad byte's line once converted is named with them)."""
    head, raw_lines = _head_of(raw_lines)
    unread_format = other_compression(head) or not_utf8_text(head)
    if unread_format:
        raise TextError(f"{name} {unread_format}")
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
        raise TextError(
            f"{name}: its {count} line(s) hold {carriage_returns} carriage returns (\\r), as lines ended by \\r "
            f"alone (classic Mac OS) read; lines here end in \\n: convert them, e.g. with tr '\\r' '\\n'{either}"
        )
    if not_utf8:
        number, _, error = not_utf8
        raise TextError(f"{name}: line {number} is not valid UTF-8 ({error.reason} at byte {error.start})")
    return lines


def _head_of(raw_lines: Iterable[bytes]) -> tuple[bytes, Iterator[bytes]]:
    """The first HEAD_BYTES bytes of `raw_lines`, over as many lines as they take (UTF-16LE's line
    break 0A 00 splits as a UTF-8 one and a NUL starting the next line), and all the lines again."""
    lines, first, size = iter(raw_lines), [], 0
    for raw in lines:
        first.append(raw)
        size += len(raw)
        if size >= unmarked_wide_text.HEAD_BYTES:
            break
    return b"".join(first)[: unmarked_wide_text.HEAD_BYTES], itertools.chain(first, lines)
