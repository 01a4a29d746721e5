"""data.name = "parallel_files": the user's own TSV or {lang} text files as train / validation / test
splits, prepared once per fingerprint of the files and settings; a resume or an evaluation on the
run's data checked against that fingerprint. Errors in the files: test_parallel_file_errors.py;
a run trained on them: test_parallel_files_run.py."""

import json
import logging
import os
import pickle
import re
import shutil

import numpy as np
import pytest

from jaxformer.data import fingerprint
from jaxformer.data.parallel_files import ParallelFiles, holdout_indices
from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import check_same_data, data_fingerprint, get_builder, load_split, prepare
from tests.data.parallel_corpus import pairs, read, section, write_bytes, write_text_files, write_tsv

# -- splits from the two file formats ------------------------------------------------------------


def test_text_files_and_tsv_files_give_their_splits_in_file_order(tmp_path):
    train = write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 300))
    validation = write_text_files(tmp_path / "corpus" / "dev.{lang}", pairs(300, 40))
    test = write_tsv(tmp_path / "corpus" / "test.tsv", pairs(340, 30))
    builder = get_builder(section(tmp_path, train=train, validation=validation, test=test))
    assert isinstance(builder, ParallelFiles)
    assert read(builder, "train") == pairs(0, 300)
    assert read(builder, "validation") == pairs(300, 40)
    assert read(builder, "test") == pairs(340, 30)
    assert set(builder.info.splits) == {"train", "validation", "test"}
    assert set(builder.info.features) == {"fr", "ja"} and builder.info.file_format.value == "array_record"
    assert data_fingerprint(builder) == builder.fingerprint and builder.fingerprint.startswith("sha256:")
    assert sorted(builder.source_files) == [
        "test: test.tsv",
        "train.fr: train.fr.gz",
        "train.ja: train.ja.gz",
        "validation.fr: dev.fr",
        "validation.ja: dev.ja",
    ]

    # The same pairs as TSV files (one gzipped), and the other way round (ja -> fr) from the text files.
    tsv = get_builder(
        section(
            tmp_path,
            train=write_tsv(tmp_path / "tsv" / "train.tsv.gz", pairs(0, 300)),
            validation=write_tsv(tmp_path / "tsv" / "dev.tsv", pairs(300, 40)),
        )
    )
    assert read(tsv, "train") == pairs(0, 300) and read(tsv, "validation") == pairs(300, 40)
    assert set(tsv.info.splits) == {"train", "validation"}  # no test file, no test split
    # The run's data section is the run's: the remedy is evaluate's own files, not a data.files.test added now.
    with pytest.raises(DataError) as raised:
        read(tsv, "test")
    assert str(raised.value).endswith(
        "has no split 'test'; it has train, validation (no data.files.test was given): "
        "score a test file with jaxformer-evaluate --source and --reference"
    )
    reverse = get_builder(
        section(tmp_path, train=train, validation=validation, source_language="ja", target_language="fr")
    )
    reverse_source = load_split(reverse, "train", ("ja", "fr"))
    assert reverse_source[0]["ja"].decode() == pairs(0, 1)[0][1] and len(reverse_source) == 300
    assert len({builder.data_dir, tsv.data_dir, reverse.data_dir}) == 3


def test_relative_paths_are_taken_from_the_current_directory_and_kept_absolute(tmp_path, monkeypatch):
    write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 60))
    monkeypatch.chdir(tmp_path)
    builder = get_builder(section(tmp_path, train="corpus/train.{lang}.gz", validation_holdout=5))
    assert builder.given_files["train"].spec == str(tmp_path / "corpus" / "train.{lang}.gz")
    assert len(read(builder, "train")) == 55
    record = json.loads((builder.data_path / fingerprint.RECORD_NAME).read_text())
    assert str(tmp_path / "corpus" / "train.{lang}.gz") in record["source"]
    monkeypatch.chdir(tmp_path / "corpus")  # the pickled builder (grain workers) keeps the absolute paths
    copy = pickle.loads(pickle.dumps(builder))
    assert copy.fingerprint == builder.fingerprint and copy.data_dir == builder.data_dir
    assert read(copy, "validation") == read(builder, "validation")


# -- the validation split held out of train ------------------------------------------------------


def test_holdout_is_disjoint_from_train_seeded_and_logged_once(tmp_path, caplog):
    corpus = pairs(0, 400)
    train = write_text_files(tmp_path / "corpus" / "train.{lang}.gz", corpus)
    with caplog.at_level(logging.INFO):
        builder = get_builder(section(tmp_path, train=train, validation_holdout=50, shuffle_seed=3))
        kept, held = read(builder, "train"), read(builder, "validation")
        read(builder, "train")  # read again: prepared once, logged once
    assert len(held) == 50 and len(kept) == 350
    assert set(kept).isdisjoint(held) and sorted(kept + held) == sorted(corpus)
    # Held-out pairs keep their file order; they are the ones the seeded draw names.
    expected = [corpus[i] for i in sorted(np.random.default_rng(3).choice(400, 50, replace=False))]
    assert held == expected
    assert [corpus[i] for i in holdout_indices(400, 50, 3)] == expected
    messages = [r.getMessage() for r in caplog.records if "no data.files.validation" in r.getMessage()]
    assert messages == ["no data.files.validation: held out 50 of 400 training pairs as the validation split (seed 3)"]

    # The same seed elsewhere gives the same split (not a cached copy: another data_dir) ...
    again = get_builder(section(tmp_path / "again", train=train, validation_holdout=50, shuffle_seed=3))
    assert read(again, "validation") == held and again.fingerprint == builder.fingerprint
    # ... another seed another one, in its own prepared copy.
    other = get_builder(section(tmp_path, train=train, validation_holdout=50, shuffle_seed=4))
    other_held = read(other, "validation")
    assert len(other_held) == 50 and other_held != held and other.data_dir != builder.data_dir
    assert set(read(other, "train")).isdisjoint(other_held)
    # With a validation file, holdout and seed change nothing: same fingerprint.
    validation = write_tsv(tmp_path / "corpus" / "dev.tsv", pairs(400, 10))
    given = [
        get_builder(section(tmp_path, train=train, validation=validation, validation_holdout=n, shuffle_seed=n))
        for n in (5, 9)
    ]
    assert given[0].fingerprint == given[1].fingerprint
    assert read(given[0], "train") == corpus and read(given[0], "validation") == pairs(400, 10)


# -- the fingerprint keys the prepared copy --------------------------------------------------------


def test_a_changed_file_of_the_same_size_gets_its_own_prepared_copy(tmp_path):
    corpus = pairs(0, 100)
    path = tmp_path / "corpus" / "train.tsv"
    write_tsv(path, corpus)
    first = get_builder(section(tmp_path, train=str(path), validation_holdout=10))
    first_train = read(first, "train")

    edited = [(source.replace("chat", "chut"), target) for source, target in corpus]  # same length
    stat = path.stat()
    write_tsv(path, edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    second = get_builder(section(tmp_path, train=str(path), validation_holdout=10))
    assert second.fingerprint != first.fingerprint and second.data_dir != first.data_dir
    assert sorted(read(second, "train") + read(second, "validation")) == sorted(edited)
    assert read(first, "train") == first_train  # the old copy stays itself

    # Copied elsewhere under the same name: the same fingerprint; renamed: another one.
    write_tsv(tmp_path / "copy" / "train.tsv", edited)
    write_tsv(tmp_path / "copy" / "renamed.tsv", edited)
    copied = get_builder(section(tmp_path, train=str(tmp_path / "copy" / "train.tsv"), validation_holdout=10))
    renamed = get_builder(section(tmp_path, train=str(tmp_path / "copy" / "renamed.tsv"), validation_holdout=10))
    assert copied.fingerprint == second.fingerprint and renamed.fingerprint != second.fingerprint
    # The settings are part of it: the record holds them and is checked against them.
    record = json.loads((second.data_path / fingerprint.RECORD_NAME).read_text())
    assert record["settings"] == {
        "source_language": "fr",
        "target_language": "ja",
        "validation_holdout": 10,
        "holdout_seed": 0,
    }
    assert record["fingerprint"] == fingerprint.fingerprint(record["files"], record["settings"]) == second.fingerprint


def test_a_record_with_other_settings_is_prepared_again(tmp_path, caplog):
    train = write_tsv(tmp_path / "corpus" / "train.tsv", pairs(0, 60))
    builder = get_builder(section(tmp_path, train=train, validation_holdout=6))
    read(builder, "train")
    path = builder.data_path / fingerprint.RECORD_NAME
    record = json.loads(path.read_text())
    record["settings"]["holdout_seed"] = 1  # consistent with itself, not with this builder
    record["fingerprint"] = fingerprint.fingerprint(record["files"], record["settings"])
    path.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        again = get_builder(section(tmp_path, train=train, validation_holdout=6))
        assert len(read(again, "validation")) == 6
    assert any(
        "records the settings" in r.getMessage() and "preparing it again" in r.getMessage() for r in caplog.records
    )
    assert json.loads(path.read_text())["settings"]["holdout_seed"] == 0


def test_a_resume_on_changed_files_names_what_changed(tmp_path):
    """Each file added, gone or edited since the run's data was prepared (from that preparation's
    record), or, where data_dir no longer holds it, each split of data.files given otherwise."""
    train = write_text_files(tmp_path / "train.{lang}", pairs(0, 20))
    builder = get_builder(section(tmp_path, train=train, validation_holdout=2))
    prepare(builder)
    trained_on, trained_files = builder.fingerprint, {"train": train, "validation": None, "test": None}

    def error_for(trained_files=trained_files, **values):
        with pytest.raises(DataError) as caught:
            check_same_data(get_builder(section(tmp_path, **values)), trained_on, "runs/fr-ja", "R", trained_files)
        prefix = rf"runs/fr-ja was trained on other data files \(fingerprint {trained_on}\) than parallel_files has"
        assert re.match(rf"{prefix} now \(sha256:\w+\): ", str(caught.value)) and str(caught.value).endswith("; R")
        return str(caught.value).split("): ", 1)[1].removesuffix("; R")

    test = write_tsv(tmp_path / "test.tsv", pairs(20, 5))
    assert error_for(train=train, validation_holdout=2, test=test) == "the test split's file test.tsv is new"
    dev = write_text_files(tmp_path / "dev.{lang}", pairs(30, 5))
    assert error_for(train=train, validation=dev) == (
        "the validation split's fr file dev.fr is new; the validation split's ja file dev.ja is new; "
        "the setting holdout_seed is unset, 0 then; the setting validation_holdout is unset, 2 then"
    )
    french = (tmp_path / "train.fr").read_bytes()
    (tmp_path / "train.fr").write_bytes(french.replace(b"Le chat", b"Un chat", 1))  # the same size
    (tmp_path / "train.ja").write_bytes((tmp_path / "train.ja").read_bytes() + "猫。\n".encode())
    assert re.fullmatch(
        r"the train split's fr file train\.fr has other bytes \(sha256 \w{12}, then \w{12}\); "
        r"the train split's ja file train\.ja has \d+ bytes, \d+ then",
        error_for(train=train, validation_holdout=2),
    )

    shutil.rmtree(tmp_path / "tfds")  # no record of the run's preparation: its data.files tell what changed
    assert error_for(train=train, validation_holdout=2) == "the files at the paths of data.files (train) changed"
    assert error_for(train=train, validation_holdout=2, test=test) == f"data.files.test is {test!r}, unset then"


def test_a_split_of_a_runs_data_needs_only_its_own_files(tmp_path):
    """With the run's fingerprint (evaluate --split), a split is read from the copy prepared from
    every file once the others are gone; its own files must be there, and be the same."""
    train = write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 60))
    test = write_tsv(tmp_path / "corpus" / "test.tsv", pairs(60, 5))
    data = section(tmp_path, train=train, test=test, validation_holdout=10)
    trained = get_builder(data)
    expected = {split: read(trained, split) for split in ("test", "validation")}
    for language in ("fr", "ja"):
        os.remove(train.replace("{lang}", language))
    with pytest.raises(DataError, match=r"data.files.train=.*train\.fr\.gz \(its 'fr' file\) not found"):
        get_builder(data)  # without the run's fingerprint: every file
    builder = get_builder(data, prepared_from=trained.fingerprint)
    assert read(builder, "test") == expected["test"] and builder.fingerprint == trained.fingerprint
    assert builder.file_lines("test") == ([1, 2, 3, 4, 5], 5)
    held_out = get_builder(data, prepared_from=trained.fingerprint)  # validation is read out of train's files
    with pytest.raises(
        DataError, match=rf"^validation: {re.escape(str(tmp_path))}/corpus/train\.fr\.gz, .*ja\.gz not found$"
    ):
        read(held_out, "validation")
    write_tsv(tmp_path / "corpus" / "test.tsv", pairs(61, 5))
    with pytest.raises(
        DataError,
        match=r"^test: its files are not those .* was prepared from: "
        r"the test split's file test.tsv \(382 bytes there, 383 here\)$",
    ):
        read(get_builder(data, prepared_from=trained.fingerprint), "test")
    write_tsv(tmp_path / "corpus" / "test.tsv", pairs(60, 5))
    shutil.rmtree(trained.data_path)  # nothing left to read the split from
    with pytest.raises(
        DataError, match=r"train\.ja\.gz not found, and no usable copy .* is missing\): restore the files$"
    ):
        read(get_builder(data, prepared_from=trained.fingerprint), "test")


# -- where each pair was in its file, and what is not text -----------------------------------------


def test_file_lines_are_known_for_splits_read_whole_from_a_file(tmp_path):
    """Where evaluate --output puts each pair: known for a split read whole from its file; not for
    a validation split held out of the training file, nor for the training split it was held out of."""
    train = write_tsv(tmp_path / "train.tsv", [*pairs(0, 5), ("", "vide"), *pairs(5, 20)])
    test = write_tsv(tmp_path / "test.tsv", [("un", "一"), ("deux", ""), ("trois", "三")])
    held_out = get_builder(section(tmp_path, train=str(train), test=str(test), validation_holdout=2))
    assert held_out.file_lines("train") is None and held_out.file_lines("validation") is None
    assert held_out.file_lines("test") == ([1, 3], 3)
    given = get_builder(section(tmp_path, train=str(train), validation=str(test)))
    assert given.file_lines("train") == ([*range(1, 6), *range(7, 27)], 26)  # pairs(start, count)
    assert given.file_lines("validation") == ([1, 3], 3)


def test_a_byte_order_mark_is_not_text(tmp_path):
    good = pairs(0, 20)
    bom = b"\xef\xbb\xbf"
    tsv = write_bytes(tmp_path / "bom.tsv", bom + "".join(f"{s}\t{t}\n" for s, t in good).encode())
    files = write_text_files(tmp_path / "bom" / "train.{lang}", good)
    for language in ("fr", "ja"):
        path = tmp_path / "bom" / f"train.{language}"
        path.write_bytes(bom + path.read_bytes())
    for train in (str(tsv), files):
        builder = get_builder(section(tmp_path, train=train, validation_holdout=2))
        assert sorted(read(builder, "train") + read(builder, "validation")) == sorted(good)


def test_a_byte_order_mark_that_starts_a_later_line_is_not_text_either(tmp_path):
    """Files joined with cat, each with its own mark: the second file's mark starts a line in the
    middle. It is not text (a reference that kept it scores less BLEU: 75.98 for 100 on one
    six-word sentence), so it is dropped as the first line's is; a mark inside a line is kept."""
    from jaxformer.data.parallel_text import decode_lines

    bom = "\ufeff".encode()
    first, second = pairs(0, 10), pairs(10, 10)
    parts = [bom + "".join(f"{s}\t{t}\n" for s, t in split_pairs).encode() for split_pairs in (first, second)]
    joined = write_bytes(tmp_path / "joined.tsv", b"".join(parts))
    builder = get_builder(section(tmp_path, train=str(joined), validation_holdout=2))
    assert sorted(read(builder, "train") + read(builder, "validation")) == sorted(first + second)
    assert decode_lines([bom + b"un\n", bom + b"deux\n", b"tr" + bom + b"ois"], "<stdin>") == [
        "un",
        "deux",
        "tr\ufeffois",
    ]


def test_a_byte_order_mark_that_starts_a_tsv_text_is_not_text_either(tmp_path):
    """A TSV file made with paste from two files that each start with a mark (`paste train.fr
    train.ja`) holds the target file's mark after line 1's tab: it was kept as the start of that
    target text, and, in a validation or test split, scored against. So was a header so made
    (`fr<TAB><mark>ja`) read as a pair; a mark inside a text is still kept."""
    bom = "\ufeff"
    good = pairs(0, 20)
    lines = [f"{bom}{s}\t{bom}{t}" if i == 0 else f"{s}\t{t}" for i, (s, t) in enumerate(good)]
    pasted = write_bytes(tmp_path / "pasted.tsv", "".join(f"{line}\n" for line in lines).encode())
    builder = get_builder(section(tmp_path, train=str(pasted), validation_holdout=2))
    assert sorted(read(builder, "train") + read(builder, "validation")) == sorted(good)
    inside = write_tsv(tmp_path / "inside.tsv", [("un" + bom + "deux", "trois"), *good[1:]])
    builder = get_builder(section(tmp_path, train=inside, validation_holdout=2))
    assert ("un" + bom + "deux", "trois") in read(builder, "train") + read(builder, "validation")
    header = write_bytes(tmp_path / "header.tsv", f"{bom}fr\t{bom}ja\n".encode() + pasted.read_bytes())
    with pytest.raises(DataError, match=r"header.tsv: line 1 \(fr<TAB>ja\) names the columns"):
        get_builder(section(tmp_path, train=str(header), validation_holdout=2)).download_and_prepare()
