"""Pairs skipped for an empty side are said where the data is prepared and, as the splits' shared
pairs are, again by each run or evaluation that reuses the prepared data, from its record's notes
(outside the fingerprint), naming the files given now; data whose record predates them reuses it
without a word of them, and data prepared before any notes has its files read again for them."""

import json
import logging

import pytest

from jaxformer.data import fingerprint, parallel_files
from jaxformer.data.sources import get_builder
from tests.data.parallel_corpus import pairs, read, section, write_text_files, write_tsv


def files_with_empty_sides(tmp_path, folder="corpus"):
    """Training files whose lines 4 (no Japanese) and 9 (no French) have an empty side, and a test
    file whose line 3 is blank; the validation split is held out of training."""
    train = pairs(0, 60)
    train[3], train[8] = (train[3][0], ""), ("", train[8][1])
    test = pairs(100, 6)
    test[2] = ("", "")
    return section(
        tmp_path,
        train=write_text_files(tmp_path / folder / "train.{lang}.gz", train),
        test=write_tsv(tmp_path / folder / "test.tsv", test),
        validation_holdout=5,
    )


def said(data, caplog) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        builder = get_builder(data)
        for split in ("train", "validation", "test"):  # each split loaded prepares (or reuses) the data anew
            read(builder, split)
    return [r.getMessage() for r in caplog.records if "with an empty side" in r.getMessage()]


def test_a_reuse_of_the_prepared_data_says_the_skipped_pairs_again(tmp_path, caplog, monkeypatch):
    data = files_with_empty_sides(tmp_path)
    corpus = tmp_path / "corpus"
    prepared = said(data, caplog)
    assert prepared == [
        f"skipped 2 pairs with an empty side in {corpus}/train.fr.gz / {corpus}/train.ja.gz "
        f"(first at {corpus}/train.ja.gz:4)",
        f"skipped 1 pair with an empty side in {corpus}/test.tsv (first at {corpus}/test.tsv:3)",
    ]
    path = get_builder(data).data_path / fingerprint.RECORD_NAME
    record = json.loads(path.read_text())
    assert record["notes"]["empty_sides"] == {
        "train": {"count": 2, "first_line": 4, "first_file": 1},
        "test": {"count": 1, "first_line": 3, "first_file": 0},
    }
    monkeypatch.setattr(parallel_files, "read_examples", lambda *args: pytest.fail("the files were read again"))
    assert said(data, caplog) == prepared  # from the record, in the same words
    moved = files_with_empty_sides(tmp_path, "moved")  # the same files elsewhere: named where they are now
    assert get_builder(moved).data_path == get_builder(data).data_path
    assert said(moved, caplog) == [message.replace(str(corpus), str(tmp_path / "moved")) for message in prepared]

    # A record written before the skipped pairs were noted (its notes the shared pairs alone) is
    # reused as it is, without reading the files and without a word of them.
    del record["notes"]["empty_sides"]
    path.write_text(json.dumps(record))
    assert said(data, caplog) == []
    assert not [r for r in caplog.records if "preparing it again" in r.getMessage()]
    assert "empty_sides" not in json.loads(path.read_text())["notes"]


def test_data_prepared_before_any_notes_has_its_files_read_again_for_the_skipped_pairs(tmp_path, caplog):
    data = files_with_empty_sides(tmp_path)
    prepared = said(data, caplog)
    path = get_builder(data).data_path / fingerprint.RECORD_NAME
    as_prepared_now = json.loads(path.read_text())
    path.write_text(json.dumps({key: value for key, value in as_prepared_now.items() if key != "notes"}))
    assert said(data, caplog) == prepared
    assert not [r for r in caplog.records if "preparing it again" in r.getMessage()]
    assert json.loads(path.read_text()) == as_prepared_now  # recorded as the preparation records them


def test_a_language_models_lines_without_text_are_said_again(tmp_path, caplog):
    data = files_with_empty_sides(tmp_path)
    data.files.test = None

    def lines_said():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            get_builder(data, side="source").download_and_prepare()
        return [r.getMessage() for r in caplog.records if "without text" in r.getMessage()]

    prepared = lines_said()
    french = tmp_path / "corpus" / "train.fr.gz"  # its line 9 is empty; line 4's Japanese is not read
    assert prepared == [f"skipped 1 line without text in {french} (first at {french}:9)"]
    assert lines_said() == prepared
