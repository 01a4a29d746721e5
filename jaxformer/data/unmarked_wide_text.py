"""UTF-16 or UTF-32 text without a byte-order mark (`iconv -t UTF-16LE`, Python's
encode("utf-16-le") write none), told from UTF-8 text by a file's first bytes. Read as UTF-8 such
text is often valid, NULs and all (Latin letters are 41 00, Cyrillic ones 1F 04, a line break 0A 00),
and would be translated as garbage."""

from __future__ import annotations

import codecs
import unicodedata

HEAD_BYTES = 512  # a file's first bytes looked at: a few lines of text, whatever its script

# Each wide encoding, and where the most significant byte of its code units is. UTF-32 first: a
# UTF-32LE unit of U+0001-U+00FF reads in UTF-16LE as that character and a U+0000.
_WIDE_ENCODINGS = (("UTF-32LE", 4, 3), ("UTF-32BE", 4, 0), ("UTF-16LE", 2, 1), ("UTF-16BE", 2, 0))
_SPACING_CONTROLS = frozenset("\t\n\r")
# Planes 1 to 3 (emoji, historic scripts, CJK extensions) gain characters with each Unicode
# version, which this Python may not know; planes 4 to 13 hold none.
_RECENT, _UNUSED = "\U00010000", "\U00040000"
_LOW_BYTES = frozenset(range(0x20))
_CONTROL_BYTES = _LOW_BYTES - {0, *b"\t\n\r"}  # no UTF-8 text holds them


def unmarked_wide_encoding(head: bytes) -> tuple[str, str] | None:
    """(the encoding, its first line of text) where `head`, a file's first HEAD_BYTES bytes, reads
    as UTF-16LE, UTF-16BE, UTF-32LE or UTF-32BE text of two characters or more (a shorter `head`,
    the whole file, a whole number of code units) and not as UTF-8 text; else None. Text, read so,
    holds no U+0000, no unpaired surrogate, no control character but a tab or line break, no
    unassigned character (outside planes 1 to 3), and a character that is not a space.
    Not UTF-8 text: `head` is not valid UTF-8 (its last character may be cut) and holds a NUL;
    or it is, and half its UTF-16 units or more have a most significant byte below 0x20, as
    characters up to U+1FFF have (Latin, Greek, Cyrillic, Hebrew, Arabic, Indic scripts), a NUL or,
    where `head` holds no NUL, a control byte but a tab or line break. UTF-8 text, stray NULs and
    all, has a letter at least every other byte. UTF-16 text whose first bytes are valid UTF-8 and
    whose characters are U+2000 or above (kana with no space or line break among them: あい is
    42 30 44 30, "B0D0") is left to be read as it is: no byte tells it from UTF-8 text."""
    has_nul = b"\x00" in head
    is_utf8 = _is_utf8_start(head)
    if not (has_nul or is_utf8):  # a Latin-1 file, say: its line is named as not UTF-8
        return None
    for encoding, width, high in _WIDE_ENCODINGS:
        if len(head) < HEAD_BYTES and len(head) % width:  # the whole file, no whole number of units
            continue
        text = _wide_text(head, encoding)
        if text is None or len(text) < 2 or text.isspace():
            continue
        if is_utf8:
            high_bytes = head[high : len(head) - len(head) % width : width]
            low = _LOW_BYTES if has_nul else _CONTROL_BYTES
            if 2 * sum(byte in low for byte in high_bytes) < len(high_bytes):
                continue
        return encoding, next(line for line in text.splitlines() if line.strip())
    return None


def _is_utf8_start(head: bytes) -> bool:
    """Whether `head` is valid UTF-8 where it ends within a character, as a file's first bytes may."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _wide_text(head: bytes, encoding: str) -> str | None:
    """`head` read in `encoding` (a code unit, or a surrogate pair, cut at its end left out), or
    None where it holds what no text does."""
    try:
        text = codecs.getincrementaldecoder(encoding.lower())().decode(head, final=False)
    except UnicodeDecodeError:  # an unpaired surrogate, or (UTF-32) a value above U+10FFFF
        return None
    for character in text:
        category = unicodedata.category(character)
        if (category == "Cc" and character not in _SPACING_CONTROLS) or (
            category == "Cn" and not _RECENT <= character < _UNUSED
        ):
            return None  # U+0000 and U+FFFE (the other order's mark) among them
    return text
