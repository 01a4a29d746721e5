"""data.name = "parallel_files": the user's own TSV or {lang} text files as train / validation / test
splits, prepared once per fingerprint of the files and settings; and a tiny run trained on them."""

import bz2
import errno
import gzip
import io
import json
import logging
import logging.handlers
import lzma
import os
import pickle
import re
import shlex
import shutil

import numpy as np
import pytest
import sacrebleu

from jaxformer.data import fingerprint
from jaxformer.data.parallel_files import ParallelFiles, holdout_indices
from jaxformer.data.parallel_text import DataError, decode_lines, read_lines
from jaxformer.data.sources import check_same_data, data_fingerprint, get_builder, load_split, prepare
from jaxformer.training.experiment import default_config

# French -> Japanese sentences built from parts: every line different, Japanese in its own script.
SUBJECTS = [
    ("le chat", "猫"),
    ("la fille", "女の子"),
    ("mon frère", "私の兄"),
    ("le professeur", "先生"),
    ("une femme", "女性"),
    ("le garçon", "男の子"),
    ("notre voisin", "隣の人"),
    ("la cuisinière", "料理人"),
]
VERBS = [("mange", "を食べる"), ("regarde", "を見る"), ("achète", "を買う"), ("aime", "が好きだ")]
OBJECTS = [
    ("une pomme", "りんご"),
    ("le poisson", "魚"),
    ("un livre", "本"),
    ("la voiture", "車"),
    ("du pain", "パン"),
    ("une fleur", "花"),
]


def sentence_pair(index: int) -> tuple[str, str]:
    """The index-th (French, Japanese) pair; distinct for indices below 2,304."""
    subject = SUBJECTS[index % 8]
    verb = VERBS[index // 8 % 4]
    obj = OBJECTS[index // 32 % 6]
    hour = index // 192 % 12 + 1
    french = f"{subject[0].capitalize()} {verb[0]} {obj[0]} à {hour} heures."
    japanese = f"{subject[1]}は{hour}時に{obj[1]}{verb[1]}。"
    return french, japanese


def pairs(start: int, count: int) -> list[tuple[str, str]]:
    return [sentence_pair(index) for index in range(start, start + count)]


def write_bytes(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def write_text_files(pattern, split_pairs, languages=("fr", "ja")):
    """Line-aligned files, one per language: `pattern` with {lang} filled in."""
    for side, language in enumerate(languages):
        text = "".join(pair[side] + "\n" for pair in split_pairs)
        write_bytes(type(pattern)(str(pattern).replace("{lang}", language)), text.encode())
    return str(pattern)


def write_tsv(path, split_pairs):
    write_bytes(path, "".join(f"{source}\t{target}\n" for source, target in split_pairs).encode())
    return str(path)


def section(tmp_path, name="parallel_files", **values):
    """The data section get_builder reads: fr -> ja, prepared under tmp_path/tfds; `train`,
    `validation`, `test` set data.files, other keywords the data keys."""
    data = default_config().data
    data.name, data.source_language, data.target_language = name, "fr", "ja"
    data.data_dir = str(tmp_path / "tfds")
    for key, value in values.items():
        if key in ("train", "validation", "test"):
            data.files[key] = value
        else:
            data[key] = value
    return data


def read(builder, split):
    source = load_split(builder, split, ("fr", "ja"))
    return [(source[i]["fr"].decode(), source[i]["ja"].decode()) for i in range(len(source))]


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
    fine = write_text_files(tmp_path / "fine" / "train.{lang}", pairs(0, 20))
    monkeypatch.setattr(fingerprint, "hash_file", lambda path: pytest.fail(f"{path} hashed"))
    for name, (data, compression) in cases.items():
        for language in ("fr", "ja") if "{lang}" in name else ("",):
            (tmp_path / name.replace("{lang}", language)).parent.mkdir(exist_ok=True)
            (tmp_path / name.replace("{lang}", language)).write_bytes(data)  # as it is, even named .gz
        compressed = tmp_path / name.replace("{lang}", "fr")
        expected = (
            f"{compression} compressed, but only gzip (.gz) and plain text are read: decompress it "
            f"({compression} -d), or recompress it with gzip"
        )
        with pytest.raises(DataError) as caught:
            get_builder(section(tmp_path, train=fine, test=str(tmp_path / name)))
        assert str(caught.value).startswith(f"data.files.test={str(tmp_path / name)!r}: {compressed}"), name
        assert str(caught.value).endswith(f" is {expected}"), name
        # ... and where a file is read without that check: evaluate --source, translate --input, stdin
        assert str(pytest.raises(DataError, read_lines, compressed).value) == f"{compressed} is {expected}"
        with pytest.raises(DataError, match=rf"^<stdin> is {re.escape(expected)}$"):
            decode_lines(io.BytesIO(data), "<stdin>")
    assert not (tmp_path / "tfds").exists()
    assert decode_lines([b"BZh9 et 1AY&SY\n"], "<stdin>") == ["BZh9 et 1AY&SY"]  # text that starts as bzip2 does


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
        f"{tmp_path / 'mac' / 'train.fr'}: its 1 line(s) hold 19 carriage returns (\\r), as lines ended by \\r alone "
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
    assert error_for(train=train, validation_holdout=2, test=test) == "the test file test.tsv is new"
    dev = write_text_files(tmp_path / "dev.{lang}", pairs(30, 5))
    assert error_for(train=train, validation=dev) == (
        "the validation.fr file dev.fr is new; the validation.ja file dev.ja is new; "
        "the setting holdout_seed is unset, 0 then; the setting validation_holdout is unset, 2 then"
    )
    french = (tmp_path / "train.fr").read_bytes()
    (tmp_path / "train.fr").write_bytes(french.replace(b"Le chat", b"Un chat", 1))  # the same size
    (tmp_path / "train.ja").write_bytes((tmp_path / "train.ja").read_bytes() + "猫。\n".encode())
    assert re.fullmatch(
        r"the train\.fr file train\.fr has other bytes \(sha256 \w{12}, then \w{12}\); "
        r"the train\.ja file train\.ja has \d+ bytes, \d+ then",
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
        match=r"^test: its files are not those .* was prepared from: test: test.tsv \(382 bytes there, 383 here\)$",
    ):
        read(get_builder(data, prepared_from=trained.fingerprint), "test")
    write_tsv(tmp_path / "corpus" / "test.tsv", pairs(60, 5))
    shutil.rmtree(trained.data_path)  # nothing left to read the split from
    with pytest.raises(
        DataError, match=r"train\.ja\.gz not found, and no usable copy .* is missing\): restore the files$"
    ):
        read(get_builder(data, prepared_from=trained.fingerprint), "test")


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
        f"{path}: its 1 line(s) hold 19 carriage returns (\\r), as lines ended by \\r alone (classic Mac OS) "
        f"read; lines here end in \\n: convert them, e.g. with tr '\\r' '\\n' (then line {line[1]} is not valid "
        f"UTF-8 either: {line[2]})"
    )
    assert "line 2 is not valid UTF-8" in str(
        pytest.raises(DataError, decode_lines, [b"a\r\n", b"\xff\r\n"], "crlf").value
    )


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


# -- a tiny run trained on such files, as the README's command says --------------------------------

# The README's example ("Your own data"), word for word: its overrides are the ones trained below.
README_COMMAND = (
    "jaxformer-train --config parallel_files --workdir runs/fr-ja "
    "--config.data.source_language=fr --config.data.target_language=ja "
    "--config.data.files.train='corpus/train.{lang}.gz' --config.data.files.test=corpus/test.tsv"
)
# What the test adds: the tiny config (made for multi30k) on the same data, trained for seconds.
TINY_RUN = [
    ("data.name", "parallel_files"),
    ("data.batch_size", "8"),  # one row per simulated device
    ("tokenizer.vocab_size", "100"),  # what 300 generated pairs allow
    ("training.num_train_steps", "4"),
    ("training.eval_every_steps", "4"),
    ("training.checkpoint_every_steps", "4"),
]


@pytest.mark.slow  # to the slow set (about 33 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_the_readme_command_trains_on_own_files_and_the_run_translates(tmp_path, monkeypatch):
    from jaxformer.commands import evaluate
    from jaxformer.decoding.generate import DecodeSettings
    from jaxformer.decoding.translator import Translator
    from jaxformer.run.loading import load_checkpoint
    from jaxformer.training import experiment
    from jaxformer.training.config_file import apply_overrides, load_config, split_overrides
    from jaxformer.training.loop import train_and_evaluate

    monkeypatch.chdir(tmp_path)  # the command's relative paths are taken from here
    write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 1300))  # 1,000 held out for validation
    test_pairs = pairs(1300, 10)
    write_tsv(tmp_path / "corpus" / "test.tsv", [*test_pairs[:3], ("", "vide"), *test_pairs[3:], ("vide", "")])
    overrides, rest = split_overrides(shlex.split(README_COMMAND)[1:])
    assert rest == ["--config", "parallel_files", "--workdir", "runs/fr-ja"]
    prepared_in = [("data.data_dir", str(tmp_path / "tfds"))]  # not ~/tensorflow_datasets
    shipped = load_config("parallel_files")
    apply_overrides(shipped, overrides + prepared_in)
    experiment.validate(shipped)

    config = load_config("tiny")
    apply_overrides(config, overrides + prepared_in + TINY_RUN)
    for key in ("name", "source_language", "target_language", "files", "validation_holdout", "shuffle_seed"):
        assert config.data[key] == shipped.data[key], key  # the data the README's command prepares
    last = train_and_evaluate(config, rest[3])
    assert last["step"] == 4 and np.isfinite(last["train"]["loss"]) and np.isfinite(last["eval"]["loss"])

    workdir = tmp_path / "runs" / "fr-ja"
    shutil.copytree(tmp_path / "corpus", tmp_path / "moved")  # the same files, elsewhere (for the resume below)
    step, metadata, _ = load_checkpoint(workdir, "latest", params=False)
    assert step == 4 and sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["4"]
    shipped_data = get_builder(shipped.data)  # the README's data: what the run was trained on
    assert metadata.data_fingerprint == shipped_data.fingerprint
    assert len(read(shipped_data, "train")) == 300 and len(read(shipped_data, "validation")) == 1000

    # What evaluate.py --split test scores: the test file, read through the checkpoint's data section.
    # Its lines with an empty side are not pairs: they are not scored, and --output keeps their lines.
    tokenizers = (metadata.load_tokenizer(), metadata.load_target_tokenizer())
    sources, references, file_lines = evaluate.split_pairs(str(workdir), "test", None, tokenizers)
    assert list(zip(sources, references)) == test_pairs
    assert file_lines == evaluate.FileLines([1, 2, 3, *range(5, 12)], 12)
    assert evaluate.split_pairs(str(workdir), "test", 3, tokenizers)[2] is None  # its first 3 lines are all pairs
    assert evaluate.split_pairs(str(workdir), "test", 4, tokenizers)[2] == evaluate.FileLines([1, 2, 3, 5], 5)
    flags = ["--workdir", str(workdir), "--split", "test", "--method", "greedy", "--no_progress", "--output"]
    assert evaluate.main([*flags, "hyp.ja", "--json", "scores.json"]) == 0
    written = (tmp_path / "hyp.ja").read_text().split("\n")
    assert len(written) == 13 and written[3] == written[11] == written[12] == ""  # 12 lines, each ended
    scored = [line for number, line in enumerate(written[:12], start=1) if number not in (4, 12)]
    # Japanese BLEU as sacreBLEU scores Japanese (ja-mecab, the dev extra's): 13a would see a token a sentence.
    bleu = sacrebleu.BLEU(trg_lang="ja")
    expected = bleu.corpus_score(scored, [[target for _, target in test_pairs]]).score
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["bleu"] == pytest.approx(expected) and scores["bleu_signature"] == str(bleu.get_signature())
    assert "|tok:ja-mecab-" in scores["bleu_signature"]
    # ... and only while the files are the ones the run was trained on: edited, its holdout would move.
    write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 1301))
    with pytest.raises(DataError, match=r"runs/fr-ja was trained on other data files \(fingerprint sha256:"):
        evaluate.split_pairs(str(workdir), "validation", None, tokenizers)
    translator = Translator.from_workdir(workdir, settings=DecodeSettings(method="greedy", max_extra_length=8))
    outputs = translator.translate(sources[:4])
    assert translator.step == 4 and len(outputs) == 4 and all(isinstance(output, str) for output in outputs)

    # The run resumes from the same files moved elsewhere and named another way (their contents,
    # not their paths, are the run's), the change logged; the edited ones are refused.
    moved = [("data.files.train", "corpus/../moved/train.{lang}.gz"), ("data.files.test", "moved/test.tsv")]
    longer = [("training.num_train_steps", "6")]
    config = load_config("tiny")
    apply_overrides(config, overrides + prepared_in + TINY_RUN + moved + longer)
    logged = logging.handlers.BufferingHandler(10_000)  # evaluate.main above set up the root logger's handlers
    logging.getLogger().addHandler(logged)
    try:
        assert train_and_evaluate(config, rest[3])["step"] == 6
    finally:
        logging.getLogger().removeHandler(logged)
    moved_train = f"data.files.train: '{tmp_path}/corpus/train.{{lang}}.gz' -> '{tmp_path}/moved/train.{{lang}}.gz'"
    assert any(moved_train in record.getMessage() for record in logged.buffer if record.levelno == logging.WARNING)
    config = load_config("tiny")
    apply_overrides(config, overrides + prepared_in + TINY_RUN + [("training.num_train_steps", "8")])
    with pytest.raises(DataError, match=r"runs/fr-ja was trained on other data files"):
        train_and_evaluate(config, rest[3])
