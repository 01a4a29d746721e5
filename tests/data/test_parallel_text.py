import gzip

import pytest

from jaxformer.data.parallel_text import DataError, SkipCounter, read_parallel_lines, read_tsv_pairs


def write(path, lines: list[bytes]):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as handle:
        handle.write(b"\n".join(lines) + b"\n")
    return path


def test_reads_pairs_with_line_numbers(tmp_path):
    source = write(tmp_path / "a.en.gz", [b"one", b"two"])
    target = write(tmp_path / "a.de.gz", [b"eins", b"zwei"])
    assert list(read_parallel_lines(source, target)) == [(1, "one", "eins"), (2, "two", "zwei")]


def test_mismatched_line_counts_name_both_files(tmp_path):
    source = write(tmp_path / "a.en", [b"one", b"two", b"three"])
    target = write(tmp_path / "a.de", [b"eins", b"zwei"])
    with pytest.raises(DataError, match=r"a\.en has 3 lines, .*a\.de has 2"):
        list(read_parallel_lines(source, target))


def test_non_utf8_line_names_file_and_line(tmp_path):
    source = write(tmp_path / "b.en.gz", [b"fine", b"also fine", b"caf\xe9 latin-1"])
    target = write(tmp_path / "b.de.gz", [b"gut", b"auch gut", b"kaffee"])
    with pytest.raises(DataError, match=r"b\.en\.gz: line 3 is not valid UTF-8"):
        list(read_parallel_lines(source, target))


def test_empty_lines_are_skipped_and_counted(tmp_path, caplog):
    source = write(tmp_path / "c.en", [b"one", b"", b"three", b"four"])
    target = write(tmp_path / "c.de", [b"eins", b"zwei", b"  ", b"vier"])
    skipped = SkipCounter()
    pairs = list(read_parallel_lines(source, target, skipped))
    assert pairs == [(1, "one", "eins"), (4, "four", "vier")]
    assert skipped.empty == 2 and skipped.first_empty.endswith("c.en:2")
    assert "skipped 2 pairs with an empty side" in caplog.text


def test_a_blank_tsv_line_is_a_pair_without_text_as_in_lang_files(tmp_path, caplog):
    """A blank line (often the last, left by an editor or `echo >>`) has no tab and no text: skipped
    and counted as a blank line of both {lang} files is, not refused as a line without a tab."""
    pairs = write(tmp_path / "d.tsv.gz", [b"one\teins", b"", b"two\tzwei", b" \r", b"\t", b""])
    skipped = SkipCounter()
    assert list(read_tsv_pairs(pairs, skipped)) == [(1, "one", "eins"), (3, "two", "zwei")]
    assert skipped.empty == 4 and skipped.first_empty.endswith("d.tsv.gz:2")
    assert "skipped 4 pairs with an empty side" in caplog.text
    for text in (b"no tab here", b"a\tb\t", b"\t\t"):  # text, or tabs, still need exactly one tab
        with pytest.raises(DataError, match=r"d\.tsv: line 2 has [02] tabs; each line must be source<TAB>target"):
            list(read_tsv_pairs(write(tmp_path / "d.tsv", [b"one\teins", text])))
