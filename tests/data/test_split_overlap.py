"""parallel_files splits that share pairs (or a language model's sentences): a training file that
holds a pair twice keeps a copy of one held out for validation, and a validation or test file may
repeat training pairs. Not refused, but said in one warning per pair of splits when the splits are
prepared, naming the file, the count and the first line, and again by each run that reuses the
prepared data (data prepared before they were recorded has them found again from its files, and
recorded where no other process holds it); splits without such pairs say nothing."""

import errno
import json
import logging
import os
import pathlib

import pytest

from jaxformer.data import fingerprint, parallel_files
from jaxformer.data.fingerprinted_builder import FingerprintedBuilder
from jaxformer.data.preparation_lock import PreparationLock
from jaxformer.data.sources import get_builder
from jaxformer.data.split_overlap import shared_examples
from tests.data.parallel_corpus import pairs, read, section, write_text_files, write_tsv


def overlap_messages(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and " also in the " in r.getMessage()
    ]


def test_shared_examples_are_the_later_splits_lines_whose_text_the_earlier_has():
    earlier = [(1, "a", "x"), (2, "b", "y")]
    later = [(7, "b", "y"), (8, "a", "y"), (9, "a", "x"), (10, "b", "y")]
    assert shared_examples(earlier, later) == [7, 9, 10]  # a pair shares both sides, not one
    assert shared_examples(earlier, [(3, "c", "z")]) == []
    assert shared_examples([(1, "a")], [(4, "a"), (5, "b")]) == [4]  # one language's sentences


def test_a_held_out_pair_whose_copy_stays_in_training_is_said(tmp_path, caplog):
    corpus = pairs(0, 300)
    repeated = corpus + corpus[:100]  # 100 pairs twice, as real corpora repeat short sentences
    train = write_text_files(tmp_path / "corpus" / "train.{lang}", repeated)
    with caplog.at_level(logging.WARNING):
        builder = get_builder(section(tmp_path, train=train, validation_holdout=50, shuffle_seed=0))
        kept, held = read(builder, "train"), read(builder, "validation")
    shared = [pair for pair in held if pair in set(kept)]
    assert shared  # the draw holds some out: what the warning counts
    first_line = 1 + repeated.index(shared[0])  # the held-out copy's line (its first copy, or its second)
    (message,) = overlap_messages(caplog)
    assert message.startswith(
        f"{len(shared)} of the 50 validation pairs held out of data.files.train={train!r} are also in the "
        f"training split (the file holds them more than once; first at {tmp_path / 'corpus' / 'train.fr'}:"
    ), message
    assert message.endswith(": validation loss and BLEU, best/ and the final choice score them as trained on")
    assert f"train.fr:{first_line})" in message or f"train.fr:{first_line + 300})" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a run that reuses the prepared data says it again
        read(get_builder(section(tmp_path, train=train, validation_holdout=50, shuffle_seed=0)), "validation")
    assert overlap_messages(caplog) == [message]


def test_validation_and_test_files_that_repeat_earlier_pairs_are_said(tmp_path, caplog):
    corpus = pairs(0, 300)
    train = write_text_files(tmp_path / "corpus" / "train.{lang}.gz", corpus)
    validation = write_tsv(tmp_path / "corpus" / "dev.tsv", [*pairs(300, 20), corpus[5], corpus[9]])
    test = write_tsv(tmp_path / "corpus" / "test.tsv", [*pairs(400, 10), pairs(305, 1)[0], corpus[9]])
    # corpus[9]: in all three splits; pairs(305, 1): in validation and test
    with caplog.at_level(logging.WARNING):
        builder = get_builder(section(tmp_path, train=train, validation=validation, test=test))
        assert len(read(builder, "validation")) == 22 and len(read(builder, "test")) == 12  # nothing left out
    assert overlap_messages(caplog) == [
        f"2 of the 22 validation pairs in data.files.validation={validation!r} are also in the training split "
        f"(first at {validation}:21): validation loss and BLEU, best/ and the final choice score them as trained on",
        f"1 of the 12 test pairs in data.files.test={test!r} is also in the training split "
        f"(first at {test}:12): a test score counts them as trained on",
        f"2 of the 12 test pairs in data.files.test={test!r} are also in the validation split "
        f"(first at {test}:11): a test score counts them as chosen on (best/, the final choice)",
    ]


def test_splits_of_their_own_say_nothing(tmp_path, caplog):
    train = write_text_files(tmp_path / "corpus" / "train.{lang}", pairs(0, 300))
    test = write_tsv(tmp_path / "corpus" / "test.tsv", pairs(300, 10))
    with caplog.at_level(logging.WARNING):
        builder = get_builder(section(tmp_path, train=train, test=test, validation_holdout=50))
        read(builder, "validation")
    assert overlap_messages(caplog) == []


def test_a_language_models_sentences_are_counted_as_sentences(tmp_path, caplog):
    sentences = [french for french, _ in pairs(0, 200)]
    train = tmp_path / "corpus" / "train.fr"
    train.parent.mkdir(parents=True)
    train.write_text("".join(f"{s}\n" for s in sentences + sentences[:60]))
    data = section(tmp_path, train=str(train), validation_holdout=40)
    data.source_language = "fr"
    with caplog.at_level(logging.WARNING):
        builder = get_builder(data, side="source")
        builder.download_and_prepare()
    (message,) = overlap_messages(caplog)
    assert " of the 40 validation sentences held out of data.files.train=" in message, message
    assert message.endswith(": the validation loss scores them as trained on")  # no BLEU, no best/


def shared_splits_files(tmp_path, folder="corpus"):
    """A training file, and validation and test files that repeat some of its pairs."""
    corpus = pairs(0, 300)
    train = write_text_files(tmp_path / folder / "train.{lang}.gz", corpus)
    validation = write_tsv(tmp_path / folder / "dev.tsv", [*pairs(300, 20), corpus[5]])
    test = write_tsv(tmp_path / folder / "test.tsv", [*pairs(400, 10), corpus[9]])
    return section(tmp_path, train=train, validation=validation, test=test)


def said_reading_every_split(data, caplog, level=logging.WARNING) -> list[str]:
    caplog.clear()
    with caplog.at_level(level):
        builder = get_builder(data)
        for split in ("train", "validation", "test"):  # each split loaded prepares (or reuses) the data anew
            read(builder, split)
    return overlap_messages(caplog)


def test_a_run_that_reuses_the_prepared_data_says_the_shared_pairs_again(tmp_path, caplog, monkeypatch):
    data = shared_splits_files(tmp_path)
    prepared = said_reading_every_split(data, caplog)
    assert len(prepared) == 2 and " of the 21 validation pairs " in prepared[0], prepared  # once each
    assert said_reading_every_split(data, caplog) == prepared  # in the same words
    assert not [r for r in caplog.records if "preparing it again" in r.getMessage()]
    record = json.loads((get_builder(data).data_path / fingerprint.RECORD_NAME).read_text())
    assert record["notes"]["split_overlaps"][0] == {
        "earlier": "train",
        "later": "validation",
        "shared": 1,
        "total": 21,
        "first_line": 21,
    }
    # ... from that record, without reading the files again.
    monkeypatch.setattr(parallel_files, "read_examples", lambda *args: pytest.fail("the files were read again"))
    assert said_reading_every_split(data, caplog) == prepared
    # The same files elsewhere share the prepared data: their warnings name them where they are now.
    moved = shared_splits_files(tmp_path, "moved")
    assert get_builder(moved).data_path == get_builder(data).data_path
    assert said_reading_every_split(moved, caplog) == [
        message.replace(str(tmp_path / "corpus"), str(tmp_path / "moved")) for message in prepared
    ]


def prepared_by_an_older_jaxformer(data, caplog) -> tuple[list[str], pathlib.Path, dict]:
    """The warnings preparing `data` says, its record's path, and that record as an older jaxformer
    wrote it: without notes (the fingerprint is the same)."""
    prepared = said_reading_every_split(data, caplog)
    path = get_builder(data).data_path / fingerprint.RECORD_NAME
    record = json.loads(path.read_text())
    notes = record.pop("notes")
    path.write_text(json.dumps(record))
    return prepared, path, {**record, "notes": notes}


def test_data_prepared_before_the_shared_pairs_were_recorded_is_reused_and_says_them(tmp_path, caplog, monkeypatch):
    data = shared_splits_files(tmp_path)
    prepared, path, as_prepared_now = prepared_by_an_older_jaxformer(data, caplog)
    assert said_reading_every_split(data, caplog, logging.INFO) == prepared  # the files read again to find them
    assert not [r for r in caplog.records if "preparing it again" in r.getMessage()]  # the same data reused
    # ... and recorded, as its preparation now records them, all else in the record as it was.
    assert json.loads(path.read_text()) == as_prepared_now
    assert f"added to {path}, an older jaxformer's record, what its preparation now notes" in caplog.text
    monkeypatch.setattr(parallel_files, "read_examples", lambda *args: pytest.fail("the files were read again"))
    assert said_reading_every_split(data, caplog) == prepared


def test_the_shared_pairs_are_not_recorded_where_the_record_cannot_be_written(tmp_path, caplog, monkeypatch):
    # A read-only prepared folder (a shared data_dir, a read-only mount); the tests run as root,
    # whom file modes do not stop: the file system's refusal stands in for it.
    data = shared_splits_files(tmp_path)
    prepared, path, _ = prepared_by_an_older_jaxformer(data, caplog)
    older = path.read_bytes()

    def read_only(path, text):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(fingerprint, "write_text_atomically", read_only)
    for _ in range(2):  # each start finds them again, without an error
        assert said_reading_every_split(data, caplog, logging.INFO) == prepared
        assert f"cannot add to {path} what its preparation now notes (Read-only file system)" in caplog.text
    assert path.read_bytes() == older


def test_the_shared_pairs_are_recorded_only_where_no_other_process_holds_the_data(tmp_path, caplog, monkeypatch):
    data = shared_splits_files(tmp_path)
    prepared, path, as_prepared_now = prepared_by_an_older_jaxformer(data, caplog)
    older = path.read_bytes()
    # Another run that reuses (or prepares) the same data meanwhile holds its lock: not written.
    other = PreparationLock(get_builder(data).data_path.parent, "parallel_files", own=True)
    other.acquire()
    try:
        assert said_reading_every_split(data, caplog) == prepared
    finally:
        other.release()
    assert path.read_bytes() == older
    # A record written again since it was checked (the data prepared again) is not overwritten.
    again = {**json.loads(older), "source": "written by another preparation"}
    check_and_record = FingerprintedBuilder.record_notes_found_again

    def prepared_again_meanwhile(builder, lock):
        path.write_text(json.dumps(again))
        check_and_record(builder, lock)

    monkeypatch.setattr(FingerprintedBuilder, "record_notes_found_again", prepared_again_meanwhile)
    said_reading_every_split(data, caplog)
    assert json.loads(path.read_text()) == again
    monkeypatch.undo()
    path.write_bytes(older)
    assert said_reading_every_split(data, caplog) == prepared  # alone, with the record it checked: written
    assert json.loads(path.read_text()) == as_prepared_now
