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
    where `head` holds no NUL, a control byte but a tab or line break. UTF-16 text is named in the
    likelier byte order (`_utf16_readings`). UTF-8 text, stray NULs and all, has a letter at least
    every other byte.
    Else UTF-16 text that reads as valid UTF-8 holding
    what UTF-8 text does not (`_utf16_read_as_utf8`). UTF-16 text whose characters all read as
    ASCII (kana U+3041-U+307F with no space or line break among them: あい is 42 30 44 30, "B0D0")
    is left to be read as it is: no byte tells it from UTF-8 text."""
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
        if width == 2:  # the other byte order may read as text too, less likely (`_utf16_readings`)
            _, encoding, text = _utf16_readings(head)[0]
        return encoding, _first_line(text)
    return _utf16_read_as_utf8(head) if is_utf8 else None


def _first_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip())


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


# What UTF-8 text holds at most now and then (a stray control, a mis-decoded Windows quote) but
# UTF-16 text of CJK or kana read as UTF-8 is full of: 。 (U+3002) is 02 30, 我 (U+6211) 11 62.
# Controls (C0 and C1) and unassigned characters; not private use: icon fonts' glyphs are text.
_NOT_TEXT_CATEGORIES = frozenset({"Cc", "Cn"})
# Controls that text files do hold: NULs (C strings), ANSI colours' escape, man pages' overstrike
# (a backspace), page breaks (form feed) and vertical tabs.
_TEXT_CONTROLS = frozenset("\t\n\r\x00\x1b\x08\x0c\x0b")
_NOT_TEXT_SHARE = 8  # one character in 8 or more, two at least; or one where a block holds all (いきます。)
_PAIRED_NULS = 3  # high bytes of line breaks or ASCII characters; two ("hello!\\x00\\n" twice) are C strings
_SPACING_HIGH_BYTES = frozenset(b"\t\r")  # Devanagari U+0900-U+097F is 09 xx, Malayalam 0D xx
_SPACING_UNITS = 3  # नमस्ते is 6: a word; "a\tb\tc\t", a file ending in its third tab, is not text


def _utf16_readings(head: bytes) -> list[tuple[tuple[int, int], str, str]]:
    """((how many values its high bytes take, NULs left out; how many of them are controls), the
    encoding, the text) for UTF-16LE and UTF-16BE where `head` reads as text (`_wide_text`), the
    likelier first: a script's characters share their high bytes, and ones with a control as their
    high byte are below U+2000, while CJK's low bytes are any (我, U+6211, is 11 62)."""
    readings = []
    for encoding, high in (("UTF-16LE", 1), ("UTF-16BE", 0)):
        text = _wide_text(head, encoding)
        if text is None or len(text) < 2 or text.isspace() or (len(head) < HEAD_BYTES and len(head) % 2):
            continue
        high_bytes = head[high : len(head) - len(head) % 2 : 2]
        readings.append(((len(set(high_bytes) - {0}), sum(0 < byte < 0x20 for byte in high_bytes)), encoding, text))
    return sorted(readings, key=lambda reading: reading[0])


def _utf16_read_as_utf8(head: bytes) -> tuple[str, str] | None:
    """(UTF-16LE or UTF-16BE, its first line of text) where `head`, valid UTF-8, holds UTF-16 text
    (`_utf16_readings`) that the other checks let through, by one of: three high bytes or more are
    NULs, and each line break is one of its units (0A 00 in UTF-16LE; 一, U+4E00, is 00 4E);
    each high byte is a tab, or each a carriage return (a word of Devanagari or Malayalam); or its
    UTF-8 reading holds controls (but _TEXT_CONTROLS) or unassigned characters, one where all high
    bytes but NULs (line breaks, spaces) are the same, else two or more and one in _NOT_TEXT_SHARE
    of its characters."""
    readings = _utf16_readings(head)
    for _, encoding, text in readings:
        high_bytes = head[encoding == "UTF-16LE" : len(head) - len(head) % 2 : 2]
        if high_bytes.count(0) >= _PAIRED_NULS and text.count("\n") == head.count(b"\n"):
            return encoding, _first_line(text)
        if len(high_bytes) >= _SPACING_UNITS and len(set(high_bytes)) == 1 and high_bytes[0] in _SPACING_HIGH_BYTES:
            return encoding, _first_line(text)
    utf8 = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    not_text = sum(
        unicodedata.category(character) in _NOT_TEXT_CATEGORIES
        and character not in _TEXT_CONTROLS
        and not _RECENT <= character < _UNUSED
        for character in utf8
    )
    if not (readings and not_text):
        return None
    (high_values, _), encoding, text = readings[0]
    if high_values == 1 or (not_text >= 2 and _NOT_TEXT_SHARE * not_text >= len(utf8)):
        return encoding, _first_line(text)
    return None
