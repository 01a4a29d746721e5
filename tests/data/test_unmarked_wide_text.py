"""UTF-16 and UTF-32 text without a byte-order mark (what `iconv -t UTF-16LE` and Python's
encode("utf-16-le") write), in any script and either byte order, is named before anything is
hashed, in a split, a file read without that check, or stdin; UTF-8 text with stray NULs is text."""

import io

import pytest

from jaxformer.data.parallel_text import DataError, decode_lines, read_lines
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


def test_unmarked_utf16_text_that_reads_as_valid_utf8_is_named_in_its_byte_order(tmp_path):
    """Kana, CJK and Indic text whose UTF-16 reads as valid UTF-8 was read as text: いきます。 is
    "D0M0~0Y0\\x020" (。 is 02 30), short lines of kana hold one NUL each (a line break, 0A 00), a
    Hindi word is "(\\t.\\t8\\t..." (Devanagari is 09 xx). 我是学生。 in UTF-16LE, and a Latin line
    without its line break in UTF-16BE, were named in the other byte order, their first line garbage."""
    texts = {
        "いきます。": "いきます。",
        "す。\n": "す。",
        "すし\n" * 3: "すし",
        "这是一本书。\n" * 3: "这是一本书。",  # 一 (U+4E00) is 00 4E: NULs at both places
        "我是学生。": "我是学生。",
        "नमस्ते": "नमस्ते",
        "നമസ്കാരം": "നമസ്കാരം",  # Malayalam is 0D xx: a carriage return every other byte
        "Nemrég mutattunk be egy 25 éves fiút.": "Nemrég mutattunk be egy 25 éves fiút.",
    }
    for text, first_line in texts.items():
        for encoding in ("UTF-16LE", "UTF-16BE"):
            data = text.encode(encoding.replace("LE", "-le").replace("BE", "-be"))
            with pytest.raises(DataError) as caught:
                decode_lines(io.BytesIO(data), "<stdin>")
            assert str(caught.value) == f"<stdin> {UNMARKED.format(encoding, first_line)}", (text, encoding)
    named = write_bytes(tmp_path / "kana.txt", "いきます。".encode("utf-16-le"))
    assert str(pytest.raises(DataError, read_lines, named).value).startswith(f"{named} looks like UTF-16LE text")


GENUINE_UTF8 = [  # lines in 12 scripts and some that are not text but are read as it
    "A dog runs.\tUn chien court.",
    "Grüße aus Köln, s'il vous plaît.",
    "Привет мир. Как дела?",
    "Γειά σου κόσμε.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया। मैं छात्र हूँ।",
    "ਸਤਿ ਸ੍ਰੀ ਅਕਾਲ",
    "สวัสดีชาวโลก",
    "我是学生。今天天气很好。",
    "今日はいい天気ですね。いきます。",
    "안녕하세요. 감사합니다.",
    "😀🎉 👨‍👩‍👧‍👦 🇫🇷 👍🏽",
    "ﾊﾟｰﾃｨｰ ｱｲｳｴｵ ∀x∈ℝ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "A0B0C0D0",
    "10101010",
    "1\t2",
    "\x1b[31mred\x1b[0m",  # ANSI colours
    "N\x08NA\x08AM\x08ME\x08E",  # man pages' overstrike
    "page\x0cpage\x0c",
    "\ue0a0 main \uf8ff",  # icon fonts' private-use glyphs
    "don\x92t",  # a Windows quote decoded as Latin-1: a C1 control
    "hello!\x00",
]


def test_utf8_text_in_any_script_is_text_alone_or_together():
    """No false alarm: each line alone, with and without its line break, and all of them together
    (whose first HEAD_BYTES bytes are looked at) read as UTF-8 text."""
    for line in GENUINE_UTF8:
        assert decode_lines(io.BytesIO(line.encode()), "<stdin>") == [line]
        assert decode_lines(io.BytesIO(f"{line}\n".encode()), "<stdin>") == [line]
    for lines in (GENUINE_UTF8, GENUINE_UTF8[::-1], GENUINE_UTF8[7:] + GENUINE_UTF8[:7]):
        text = "".join(f"{line}\n" for line in lines)
        assert decode_lines(io.BytesIO(text.encode()), "<stdin>") == lines
