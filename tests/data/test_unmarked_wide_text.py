"""UTF-16 and UTF-32 text without a byte-order mark (what `iconv -t UTF-16LE` and Python's
encode("utf-16-le") write), in any script and either byte order, is named before anything is
hashed, in a split, a file read without that check, or stdin; UTF-8 text with stray NULs is text."""

import io

from jaxformer.data.parallel_text import decode_lines, read_lines
from tests.data.parallel_corpus import pairs, write_bytes
from tests.data.test_parallel_file_errors import assert_named_before_hashing

UNMARKED = (
    "looks like {0} text without a byte-order mark (its first line so read: {1!r}), "
    "but text is read as UTF-8: convert it (iconv -f {0} -t UTF-8)"
)
WIDE_ENCODINGS = ("UTF-16LE", "UTF-16BE", "UTF-32LE", "UTF-32BE")


def unmarked_cases(texts: dict[str, str]) -> dict[str, tuple[bytes, str]]:
    """Each of `texts` (a name: its text) in each of WIDE_ENCODINGS without a mark, as
    assert_named_before_hashing takes them: the phrase names the encoding and the first line."""
    return {
        f"{name}.{encoding.lower()}.tsv": (
            text.encode(encoding.replace("LE", "-le").replace("BE", "-be")),
            UNMARKED.format(encoding, text.splitlines()[0][:40]),
        )
        for name, text in texts.items()
        for encoding in WIDE_ENCODINGS
    }


def test_utf16_and_utf32_text_without_a_byte_order_mark_is_named_not_read_as_nuls(tmp_path, monkeypatch):
    """`iconv -t UTF-16LE` and Python's encode("utf-16-le") write no mark: read as UTF-8, valid NULs
    and all, each line after the first started with a NUL (UTF-16LE's \\n is 0A 00), one line more
    than the file's, and translate gave a translation of NULs and ASCII for each."""
    text = "".join(f"{s}\t{t}\n" for s, t in pairs(0, 20))
    assert_named_before_hashing(tmp_path, monkeypatch, unmarked_cases({"pairs": text}))
    # NULs alone, or a NUL beside one character, are text as before: an unknown piece each.
    assert decode_lines([b"\x00\x00\x00\x00\n", b"A\x00\n", b"AB\x00\x00\n"], "<stdin>") == [
        "\x00" * 4,
        "A\x00",
        "AB\x00\x00",
    ]


def test_unmarked_utf16_and_utf32_text_of_any_script_is_named_and_utf8_with_stray_nuls_is_text(tmp_path, monkeypatch):
    """Text whose first characters are not U+0001-U+00FF read as UTF-8 before: Cyrillic in UTF-16LE
    ('П' is 1F 04) is valid UTF-8 holding control bytes, one character and a line break ('A' 0A in
    UTF-16LE) was two lines, and CJK or emoji were 'not valid UTF-8'. Each is named, in either byte
    order; UTF-8 text with stray NULs, even at every other byte, is text as before."""
    texts = {
        "cyrillic": "Привет мир\tHello world\n",
        "cyrillic_word": "Привет",  # no space, no line break: no NUL in UTF-16
        "greek": "Γειά σου κόσμε\tHello world\n",
        "cjk": "中文文本\t中文\n",
        "emoji": "😀🎉\tparty\n",  # surrogate pairs in UTF-16
        "one_character": "A\n",
        "one_cyrillic_character": "Я\nБ\n",
        "long_first_line": "Привет мир — «ёлки», " * 30 + "\n",
        "latin": "Un chien court.\tA dog runs.\n",
    }
    assert_named_before_hashing(tmp_path, monkeypatch, unmarked_cases(texts))
    stray_nuls = {
        "\x00\n": ["\x00"],
        "\x00\n\x00\n": ["\x00", "\x00"],
        "Hello\x00 wor\x00ld\n": ["Hello\x00 wor\x00ld"],
        "hello!\x00\nworld!\x00\n": ["hello!\x00", "world!\x00"],  # C strings, their NULs at odd bytes
        "Привет\x00 мир\x00\n": ["Привет\x00 мир\x00"],
        "1\t2\x00\n": ["1\t2\x00"],  # a control byte or NUL every other byte, 5 bytes: no UTF-16
        "A dog\x00 runs.\n" * 40: ["A dog\x00 runs."] * 40,
    }
    for text, lines in stray_nuls.items():
        assert decode_lines(io.BytesIO(text.encode()), "<stdin>") == lines, text
        assert read_lines(write_bytes(tmp_path / "nuls.txt", text.encode())) == lines, text
