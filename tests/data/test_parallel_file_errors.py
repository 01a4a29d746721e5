"""data.name = "parallel_files" on bad files: each error is one line naming the file, line or key,
found before anything is hashed or prepared (a missing, unreadable or otherwise compressed file,
a split holding another's pairs, a line without its tab, text that is not UTF-8), and a
preparation that fails on bad input leaves nothing behind."""

import bz2
import codecs
import errno
import gzip
import io
import logging
import lzma
import os
import re

import pytest

from jaxformer.data import fingerprint
from jaxformer.data.parallel_text import DataError, decode_lines, read_lines
from jaxformer.data.sources import get_builder, load_split, prepare
from tests.data.parallel_corpus import pairs, read, section, write_bytes, write_text_files, write_tsv

# -- errors: one line, naming the file, line or key, before anything is prepared -------------------


def test_file_errors_name_the_file_before_anything_is_prepared(tmp_path):
    fine = write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 20))
    cases = {
        "missing TSV": (dict(train=str(tmp_path / "nowhere.tsv")), r"data\.files\.train=.*nowhere\.tsv.*not found"),
        "missing {lang} file": (
            dict(train=fine, test=str(tmp_path / "corpus" / "test.{lang}")),
            r"data\.files\.test=.*: .*/corpus/test\.fr \(its 'fr' file\) not found; "
            r".*/corpus/test\.ja \(its 'ja' file\) not found",
        ),
        "neither": (
            dict(train=fine, validation=str(tmp_path / "dev.txt")),
            r"data\.files\.validation=.*dev\.txt.* neither",
        ),
        "TSV with {lang}": (dict(train=str(tmp_path / "train.{lang}.tsv")), r"a TSV file holds both languages"),
        "remote": (
            dict(train=fine, test="gs://bucket/corpus/test.{lang}.gz"),
            r"^data\.files\.test='gs://bucket/corpus/test\.\{lang\}\.gz': the files are read from a local path; ",
        ),
        "no train": (dict(validation=fine), r"data\.name='parallel_files' needs data\.files\.train"),
        "a directory": (dict(train=str(tmp_path / "corpus.tsv")), r"corpus\.tsv is not a file"),
        "validation is train": (
            dict(train=fine, validation=fine),
            r"^data\.files\.validation=.* holds the same text as data\.files\.train=.*: each split needs pairs "
            r"of its own; leave it unset to hold data\.validation_holdout training pairs out for validation$",
        ),
        "test is a copy of validation": (
            dict(train=fine, validation=str(tmp_path / "dev.tsv"), test=str(tmp_path / "copy" / "dev.tsv")),
            r"^data\.files\.test=.*copy/dev\.tsv' holds the same text as data\.files\.validation=.*dev\.tsv'"
            r": each split needs pairs of its own$",
        ),
    }
    write_tsv(tmp_path / "dev.tsv", pairs(20, 5))
    write_tsv(tmp_path / "copy" / "dev.tsv", pairs(20, 5))
    (tmp_path / "corpus.tsv").mkdir()
    for name, (values, message) in cases.items():
        with pytest.raises(DataError, match=message) as caught:
            get_builder(section(tmp_path, **values))
        assert "\n" not in str(caught.value), name
    assert not (tmp_path / "tfds").exists()  # nothing prepared, nothing written

    with pytest.raises(DataError, match=r"data\.files\.test is set, but data\.files applies to .*not 'multi30k'"):
        get_builder(section(tmp_path, name="multi30k", test=fine))
    with pytest.raises(DataError, match="data.raw_dir and data.download apply to multi30k only"):
        get_builder(section(tmp_path, train=fine, raw_dir=str(tmp_path)))


def make_unreadable(path, monkeypatch):
    """`path` without read permission; where that does not stop this process (root), opening it
    raises the PermissionError a user's process would get."""
    path.chmod(0)
    if os.access(path, os.R_OK):
        real_open = open

        def denying_open(file, *args, **kwargs):
            if os.fspath(file) == str(path):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr("builtins.open", denying_open)


@pytest.mark.parametrize("form", ["text files", "tsv"])
def test_an_unreadable_file_is_named_before_anything_is_hashed_or_prepared(tmp_path, monkeypatch, form):
    fine = write_text_files(tmp_path / "corpus" / "train.{lang}", pairs(0, 20))
    dev_tsv = write_tsv(tmp_path / "dev.tsv", pairs(20, 5))
    if form == "tsv":
        unreadable, values = tmp_path / "dev.tsv", dict(train=fine, validation=dev_tsv)
        message = rf"^data\.files\.validation='.*dev\.tsv': {unreadable} cannot be read \(Permission denied\)$"
    else:
        unreadable, values = tmp_path / "corpus" / "train.ja", dict(train=fine)
        message = rf"^data\.files\.train='.*': {unreadable} \(its 'ja' file\) cannot be read \(Permission denied\)$"
    make_unreadable(unreadable, monkeypatch)
    with pytest.raises(DataError, match=message):
        get_builder(section(tmp_path, **values))
    assert not (tmp_path / "tfds").exists()


# `printf 'un\tdeux\n' | zstd`: the standard library (3.11) writes no zstd
ZSTD_PAIR = bytes.fromhex("28b52ffd0458410000756e09646575780a0c9df517")


def assert_named_before_hashing(tmp_path, monkeypatch, cases: dict[str, tuple[bytes, str]]):
    """Each file of `cases` (its name: (its bytes, the phrase after its path)) given as a test
    split is refused in that phrase before anything is hashed, and so is it where a file is read
    without that check (evaluate --source, translate --input, stdin)."""
    fine = write_text_files(tmp_path / "fine" / "train.{lang}", pairs(0, 20))
    monkeypatch.setattr(fingerprint, "hash_file", lambda path: pytest.fail(f"{path} hashed"))
    for name, (data, expected) in cases.items():
        for language in ("fr", "ja") if "{lang}" in name else ("",):
            (tmp_path / name.replace("{lang}", language)).parent.mkdir(exist_ok=True)
            (tmp_path / name.replace("{lang}", language)).write_bytes(data)  # as it is, even named .gz
        named = tmp_path / name.replace("{lang}", "fr")
        with pytest.raises(DataError) as caught:
            get_builder(section(tmp_path, train=fine, test=str(tmp_path / name)))
        assert str(caught.value).startswith(f"data.files.test={str(tmp_path / name)!r}: {named}"), name
        assert str(caught.value).endswith(f" {expected}"), name
        assert str(pytest.raises(DataError, read_lines, named).value) == f"{named} {expected}"
        with pytest.raises(DataError, match=rf"^<stdin> {re.escape(expected)}$"):
            decode_lines(io.BytesIO(data), "<stdin>")
    assert not (tmp_path / "tfds").exists()


def test_a_file_compressed_otherwise_than_gzip_is_named_before_anything_is_hashed(tmp_path, monkeypatch):
    """xz, bzip2 and zstd files (whatever their names say) read as "line 1 is not valid UTF-8", or
    as "not a gzip file" when named .gz: they are named by their format, before anything is hashed."""
    text = "".join(f"{s}\t{t}\n" for s, t in pairs(0, 20)).encode()
    cases = {  # file name: (bytes, the format the message names)
        "xz.tsv": (lzma.compress(text), "xz"),
        "train.tsv.gz": (lzma.compress(text), "xz"),  # named .gz, xz inside
        "corpus.tsv.gz": (bz2.compress(text), "bzip2"),
        "bz2/train.{lang}": (bz2.compress(text), "bzip2"),  # no suffix
        "empty-bz2.tsv": (bz2.compress(b""), "bzip2"),
        "zstd.tsv": (ZSTD_PAIR, "zstd"),
    }
    phrase = (
        "is {0} compressed, but only gzip (.gz) and plain text are read: decompress it ({0} -d), "
        "or recompress it with gzip"
    )
    assert_named_before_hashing(
        tmp_path, monkeypatch, {name: (data, phrase.format(format)) for name, (data, format) in cases.items()}
    )
    assert decode_lines([b"BZh9 et 1AY&SY\n"], "<stdin>") == ["BZh9 et 1AY&SY"]  # text that starts as bzip2 does


def test_gzip_data_not_named_gz_and_utf16_text_are_named_before_anything_is_hashed(tmp_path, monkeypatch):
    """A gzip file named without .gz, and UTF-16 or UTF-32 text (Excel's "Unicode text" export,
    with its byte-order mark), read as "line 1 is not valid UTF-8 (invalid start byte at byte 0)":
    they are named by what they hold, with the command that makes them readable."""
    text = "".join(f"{s}\t{t}\n" for s, t in pairs(0, 20))
    gunzip = (
        "holds gzip compressed data where text should be (only a file named *.gz is decompressed, once): "
        "decompress it (gunzip), or give it as a file named *.gz"
    )
    other = "is {0} text (its byte-order mark says so), but text is read as UTF-8: convert it (iconv -f {0} -t UTF-8)"
    cases = {  # file name: (bytes, the phrase that names them)
        "train.tsv": (gzip.compress(text.encode()), gunzip),
        "gz/train.{lang}": (gzip.compress(text.encode()), gunzip),
        "utf16.tsv": (text.encode("utf-16"), other.format("UTF-16")),
        "utf16be.tsv": (codecs.BOM_UTF16_BE + text.encode("utf-16-be"), other.format("UTF-16")),
        "utf32.tsv": (text.encode("utf-32"), other.format("UTF-32")),
    }
    assert_named_before_hashing(tmp_path, monkeypatch, cases)
    # A .gz file is decompressed once: the gzip data it holds is read, and checked as text.
    assert read_lines(write_bytes(tmp_path / "fine.tsv.gz", text.encode())) == text.splitlines()
    with pytest.raises(DataError, match=r"utf16\.tsv\.gz is UTF-16 text"):
        read_lines(write_bytes(tmp_path / "utf16.tsv.gz", text.encode("utf-16")))


def test_a_read_error_after_the_check_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """A disk's error (EIO) while hashing, or a file replaced by a folder before it is read."""
    train = write_text_files(tmp_path / "train.{lang}", pairs(0, 20))

    def failing_hash(path):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    with monkeypatch.context() as patched:
        patched.setattr(fingerprint, "hash_file", failing_hash)
        with pytest.raises(DataError, match=rf"^{tmp_path}/train\.(fr|ja): cannot be read \(Input/output error\)$"):
            get_builder(section(tmp_path, train=train))
    (tmp_path / "train.fr").unlink()
    (tmp_path / "train.fr").mkdir()  # as if replaced after the check: read_lines opens what is there
    with pytest.raises(DataError, match=rf"^{tmp_path}/train\.fr: cannot be read \(Is a directory\)$"):
        read_lines(tmp_path / "train.fr")


def test_splits_with_the_same_pairs_in_other_file_formats_are_refused(tmp_path):
    """Other bytes, the same pairs: a compressed copy, or a TSV file of what {lang} files hold.
    Found when the pairs are read, before anything is prepared (and a corrected rerun prepares)."""
    train = write_text_files(tmp_path / "train.{lang}", pairs(0, 20))
    compressed = write_text_files(tmp_path / "copy" / "train.{lang}.gz", pairs(0, 20))
    dev = write_text_files(tmp_path / "dev.{lang}", pairs(20, 5))
    dev_tsv = write_tsv(tmp_path / "dev.tsv", pairs(20, 5))
    for values, message in (
        (
            dict(train=train, validation=compressed),
            r"^data\.files\.validation=.*copy/train\.\{lang\}\.gz' holds the same pairs as data\.files\.train=",
        ),
        (dict(train=train, validation=dev, test=dev_tsv), r"^data\.files\.test=.*dev\.tsv' holds the same pairs as "),
    ):
        with pytest.raises(
            DataError, match=message + r".*\(in another file format\): each split needs pairs of its own$"
        ):
            load_split(get_builder(section(tmp_path, **values)), "train", ("fr", "ja"))
        assert not list((tmp_path / "tfds").rglob("*.array_record*"))  # nothing prepared
    assert len(read(get_builder(section(tmp_path, train=train, validation=dev)), "validation")) == 5


def test_content_errors_name_the_file_and_line(tmp_path, caplog):
    def error_for(**files):
        with pytest.raises(DataError) as caught:
            get_builder(section(tmp_path, **{"validation_holdout": 2, **files})).download_and_prepare()
        assert "\n" not in str(caught.value)
        return str(caught.value)

    good = pairs(0, 20)
    tabs = write_bytes(tmp_path / "tabs.tsv", b"".join(f"{s}\t{t}\n".encode() for s, t in good[:4]) + b"a\tb\tc\n")
    assert error_for(train=str(tabs)) == (
        f"{tabs}: line 5 has 2 tabs; each line must be source<TAB>target, with one tab"
    )
    no_tab = write_bytes(tmp_path / "no_tab.tsv.gz", b"Une phrase sans tabulation\n")
    assert f"{no_tab}: line 1 has 0 tabs" in error_for(train=str(no_tab))

    latin1 = write_text_files(tmp_path / "latin1" / "train.{lang}", good)
    (tmp_path / "latin1" / "train.fr").write_bytes(("\n".join(s for s, _ in good[:7]) + "\n").encode() + b"caf\xe9\n")
    (tmp_path / "latin1" / "train.ja").write_bytes(("\n".join(t for _, t in good[:8]) + "\n").encode())
    assert re.search(r"latin1/train\.fr: line 8 is not valid UTF-8", error_for(train=latin1))

    # Lines ended by \r alone (classic Mac OS) read as one line: named as such, not as a count mismatch.
    mac = write_text_files(tmp_path / "mac" / "train.{lang}", good)
    (tmp_path / "mac" / "train.fr").write_bytes("\r".join(s for s, _ in good).encode() + b"\r")
    assert error_for(train=mac) == (
        f"{tmp_path / 'mac' / 'train.fr'}: its 1 line(s) hold 20 carriage returns (\\r), as lines ended by \\r alone "
        "(classic Mac OS) read; lines here end in \\n: convert them, e.g. with tr '\\r' '\\n'"
    )
    stray = [(f"{s}\r", t) if i % 3 == 0 else (s, t) for i, (s, t) in enumerate(good)]  # a few stray ones are text
    stray[1] = (f"A\r{stray[1][0]}\r", stray[1][1])  # even one line with two, and the first line with one
    stray_files = write_text_files(tmp_path / "stray" / "train.{lang}", [(s.replace("\r", "\rx"), t) for s, t in stray])
    assert len(read(get_builder(section(tmp_path, train=stray_files, validation_holdout=2)), "train")) == 18
    assert decode_lines([b"A man\rin a hat .\n"], "<stdin>") == ["A man\rin a hat ."]  # one line, one \r: text

    short = write_text_files(tmp_path / "short" / "train.{lang}.gz", good)
    write_bytes(tmp_path / "short" / "train.ja.gz", ("\n".join(t for _, t in good[:-1]) + "\n").encode())
    assert re.search(r"train\.fr\.gz has 20 lines, .*train\.ja\.gz has 19", error_for(train=short))

    assert error_for(train=write_tsv(tmp_path / "small.tsv", good), validation_holdout=20) == (
        f"data.validation_holdout=20 is as large as the training split: data.files.train="
        f"{str(tmp_path / 'small.tsv')!r} has 20 pairs with text on both sides; lower data.validation_holdout or "
        "give data.files.validation"
    )
    empty = write_tsv(tmp_path / "empty.tsv", [("", "x")] * 3)
    assert "holds no pair with text on both sides" in error_for(train=empty)

    # Pairs with an empty side are skipped and counted, with a warning naming the first.
    holes = [*good[:5], ("", "空"), ("vide", "  "), *good[5:]]
    train = write_text_files(tmp_path / "holes" / "train.{lang}", holes)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        builder = get_builder(section(tmp_path, train=train, validation_holdout=2))
        assert sorted(read(builder, "train") + read(builder, "validation")) == sorted(good)
    warnings = [r.getMessage() for r in caplog.records if "empty side" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 2 pairs" in warnings[0] and "holes/train.fr:6" in warnings[0]

    # ... per split: clean validation and test files are not blamed for the training file's holes.
    clean = write_text_files(tmp_path / "clean" / "valid.{lang}", good[:6])
    clean_test = write_text_files(tmp_path / "clean" / "test.{lang}", good[6:12])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        get_builder(section(tmp_path, train=train, validation=clean, test=clean_test)).download_and_prepare()
    warnings = [r.getMessage() for r in caplog.records if "empty side" in r.getMessage()]
    assert len(warnings) == 1 and "holes/train.fr" in warnings[0], warnings

    # A truncated download, plain text named .gz, upper-case suffixes.
    whole = gzip.compress("".join(f"{s}\t{t}\n" for s, t in good).encode(), mtime=0)
    cut = write_bytes(tmp_path / "cut.tsv", whole[: len(whole) // 2])  # not .gz: written as given
    cut = cut.rename(tmp_path / "cut.tsv.gz")
    assert error_for(train=str(cut)).startswith(f"{cut}: not a complete gzip file (")
    plain = tmp_path / "plain.tsv.gz"
    plain.write_bytes(b"un\tdeux\n")
    assert error_for(train=str(plain)).startswith(f"{plain}: not a gzip file (")
    assert error_for(train=str(plain)).endswith("); rename it without .gz if it is plain text")
    crc = bytearray(whole)
    crc[-8] ^= 0xFF  # the stored CRC: a damaged gzip, not plain text
    damaged = write_bytes(tmp_path / "damaged.tsv", bytes(crc)).rename(tmp_path / "damaged.tsv.gz")
    assert error_for(train=str(damaged)).startswith(f"{damaged}: not a complete gzip file (CRC check failed")
    # Two empty files are not "the same text": the one that is empty is named as such.
    empty_validation, empty_test = write_tsv(tmp_path / "v.tsv", []), write_tsv(tmp_path / "t.tsv", [])
    fine = write_tsv(tmp_path / "fine.tsv", good)
    assert "holds no pair with text on both sides" in error_for(
        train=fine, validation=empty_validation, test=empty_test
    )
    upper = tmp_path / "upper" / "TRAIN.TSV.GZ"
    upper.parent.mkdir()
    upper.write_bytes(whole)
    assert read(get_builder(section(tmp_path, train=str(upper), validation_holdout=2)), "train")[0] in good


def test_a_failed_preparation_leaves_no_empty_dataset_folder(tmp_path):
    """The builder's `<name>/files-<fingerprint>` folders that tfds made for a preparation that
    failed on bad input are taken back; the same files corrected prepare as usual."""
    broken = write_bytes(tmp_path / "train.tsv", b"".join(f"{s}\t{t}\n".encode() for s, t in pairs(0, 20)) + b"x\n")
    builder = get_builder(section(tmp_path, train=str(broken), validation_holdout=2))
    with pytest.raises(DataError, match="line 21 has 0 tabs"):
        prepare(builder)
    assert not (tmp_path / "tfds" / "parallel_files").exists()
    write_tsv(tmp_path / "train.tsv", pairs(0, 20))
    assert len(read(get_builder(section(tmp_path, train=str(broken), validation_holdout=2)), "train")) == 18


def test_the_last_lines_carriage_return_counts_as_a_line_end():
    """Two sentences ended by \\r alone (b"A dog runs.\\rA cat sleeps.\\r") read as one line, its
    final \\r uncounted (1 inside the line, less than 2): translate gave one translation for them."""
    with pytest.raises(
        DataError, match=r"^<stdin>: its 1 line\(s\) hold 2 carriage returns \(\\r\), as lines ended by "
    ):
        decode_lines([b"A dog runs.\rA cat sleeps.\r"], "<stdin>")
    assert decode_lines([b"A dog runs.\r"], "<stdin>") == ["A dog runs."]  # one line so ended
    assert decode_lines([b"A\r\n", b"B\r"], "<stdin>") == ["A", "B"]  # a CRLF file cut before its last \n
    assert decode_lines([b"A man\rin a hat"], "<stdin>") == ["A man\rin a hat"]  # a stray \r: text


def test_lines_ended_by_carriage_returns_are_named_before_a_byte_that_is_not_utf8(tmp_path):
    """A classic Mac OS file reads as one line: its "line 1 is not valid UTF-8" would name the wrong
    line. The line endings are named first, with the line the byte is on once they are converted."""
    french = [s for s, _ in pairs(0, 20)]
    french[12] = "Un café noir."
    mac = b"\xef\xbb\xbf" + "\r".join(french).encode().replace("é".encode(), b"\xe9", 1) + b"\r"  # one latin-1 byte
    path = tmp_path / "mac.fr"
    path.write_bytes(mac)
    converted = str(pytest.raises(DataError, decode_lines, io.BytesIO(mac.replace(b"\r", b"\n")), "tr").value)
    line = re.fullmatch(r"tr: line (\d+) is not valid UTF-8 \((.*) at byte \d+\)", converted)
    assert line and line[1] == "13", converted  # the independent reference: the converted file's own error
    assert str(pytest.raises(DataError, read_lines, path).value) == (
        f"{path}: its 1 line(s) hold 20 carriage returns (\\r), as lines ended by \\r alone (classic Mac OS) "
        f"read; lines here end in \\n: convert them, e.g. with tr '\\r' '\\n' (then line {line[1]} is not valid "
        f"UTF-8 either: {line[2]})"
    )
    assert "line 2 is not valid UTF-8" in str(
        pytest.raises(DataError, decode_lines, [b"a\r\n", b"\xff\r\n"], "crlf").value
    )


def test_a_tsv_header_line_is_refused_not_read_as_a_pair(tmp_path):
    """pandas' to_csv(sep="\t") writes the column names first: read as a pair, the header would be
    trained on, or scored in a test split. Line 1 naming the languages (either order, any case) or
    source/target is refused naming the file; the other order says the columns are swapped."""
    body = "".join(f"{s}\t{t}\n" for s, t in pairs(0, 20))
    cases = {  # file name: (its first line, the end of the message)
        "codes.tsv": ("fr\tja", ""),
        "upper.tsv.gz": ("FR\tJA", ""),
        "names.tsv": ("source\ttarget", ""),
        "swapped.tsv": ("ja\tfr", "; its columns are ja, fr: the run reads source<TAB>target (fr first)"),
    }
    for name, (header, end) in cases.items():
        path = write_bytes(tmp_path / name, f"{header}\n{body}".encode())
        shown = "<TAB>".join(header.lower().split("\t"))
        with pytest.raises(DataError) as caught:
            read(get_builder(section(tmp_path / name.split(".")[0], train=str(path), validation_holdout=2)), "train")
        assert str(caught.value) == (
            f"{path}: line 1 ({shown}) names the columns, as a header does, and every line is read as a pair: "
            f"remove that line (pandas: to_csv(..., header=False)){end}"
        ), name
    # A first pair that only holds a code, or other words, is a pair.
    for first in ("fr\tle japonais", "Source\tソース"):
        path = write_bytes(tmp_path / "pairs" / "train.tsv", f"{first}\n{body}".encode())
        assert len(read(get_builder(section(tmp_path / "pairs", train=str(path), validation_holdout=2)), "train")) == 19
