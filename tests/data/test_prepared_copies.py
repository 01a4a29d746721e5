"""Prepared data keyed by its source files (issue 14): a user's Multi30k files get their own prepared
copy, named by their fingerprint, checked on use and prepared again when it does not match."""

import gzip
import json
import logging
import os
import pickle
import shutil

import pytest
import tensorflow_datasets as tfds

from jaxformer.data import fingerprint, multi30k
from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import data_fingerprint, get_builder, load_split
from tests.data.test_sources import section


def write_corpus(directory, template="{prefix} {language} user sentence {i}", pairs=3):
    """The twelve Multi30k files, written reproducibly (gzip mtime 0)."""
    directory.mkdir(parents=True, exist_ok=True)
    for prefix in multi30k.SPLIT_FILES.values():
        for language in multi30k.LANGUAGES:
            text = "".join(template.format(prefix=prefix, language=language, i=i) + "\n" for i in range(pairs))
            (directory / f"{prefix}.{language}.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    return directory


def read_split(builder, split="train"):
    source = load_split(builder, split, ("en", "de"))
    return [source[i]["en"].decode() for i in range(len(source))]


def test_raw_dir_beside_prepared_vendored_copy_reads_the_users_files(data_dir, tmp_path, caplog):
    tfds_dir = tmp_path / "tfds"
    shutil.copytree(data_dir, tfds_dir)  # the vendored copy, already prepared (copied: the fixture is shared)
    vendored = get_builder(section("multi30k", data_dir=str(tfds_dir)))
    assert vendored.data_path.exists()
    # What the code before the fingerprint wrote: <data_dir>/multi30k/1.0.0, also ignored now.
    shutil.copytree(vendored.data_path, tfds_dir / "multi30k" / "1.0.0")
    raw = write_corpus(tmp_path / "raw")

    with caplog.at_level(logging.INFO):
        builder = get_builder(section("multi30k", data_dir=str(tfds_dir), raw_dir=str(raw)))
        assert read_split(builder) == [f"train en user sentence {i}" for i in range(3)]
    assert builder.data_dir != vendored.data_dir
    assert builder.builder_config.name == "files-" + builder.fingerprint[len("sha256:") :][:12]
    assert (
        data_fingerprint(builder)
        == builder.fingerprint
        == fingerprint.fingerprint(fingerprint.hash_files({name: raw / name for name in multi30k.FILE_NAMES}))
    )
    assert vendored.fingerprint != builder.fingerprint
    assert sorted(builder.source_files) == sorted(multi30k.FILE_NAMES)
    lines = [r.getMessage() for r in caplog.records if "fingerprint sha256:" in r.getMessage()]
    assert len(lines) == 1 and str(raw) in lines[0] and builder.data_dir in lines[0] and builder.fingerprint in lines[0]
    # The vendored copy is untouched and still read as before.
    assert len(load_split(vendored, "test_2016_flickr", ("en", "de"))) == 1_000


def test_a_changed_file_of_the_same_size_gets_its_own_prepared_copy(tmp_path):
    raw = write_corpus(tmp_path / "raw")
    first = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    assert read_split(first) == [f"train en user sentence {i}" for i in range(3)]

    path = raw / "train.en.gz"
    old_bytes, old_stat = path.read_bytes(), path.stat()
    for letter in "abcdefghijklmnopqrstuvwxyz":  # one letter changed, compressed size unchanged
        text = "".join(f"train en uxer sentence {i}".replace("x", letter) + "\n" for i in range(3))
        new_bytes = gzip.compress(text.encode(), mtime=0)
        if len(new_bytes) == len(old_bytes) and letter != "s":
            break
    else:
        pytest.fail("no same-size variant found")
    path.write_bytes(new_bytes)
    os.utime(path, ns=(old_stat.st_atime_ns, old_stat.st_mtime_ns))  # same size and same mtime

    second = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    assert second.fingerprint != first.fingerprint and second.data_dir != first.data_dir
    assert read_split(second) == [f"train en u{letter}er sentence {i}" for i in range(3)]
    assert read_split(first) == [f"train en user sentence {i}" for i in range(3)]  # the old copy stays itself


def _record(builder):
    return json.loads((builder.data_path / fingerprint.RECORD_NAME).read_text())


def _tamper_record(builder, edit):
    path = builder.data_path / fingerprint.RECORD_NAME
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def test_the_stored_fingerprint_is_checked_and_a_bad_copy_prepared_again(tmp_path, caplog):
    raw = write_corpus(tmp_path / "raw")
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    read_split(builder)
    good = _record(builder)
    assert good["fingerprint"] == builder.fingerprint and good["config"] == builder.builder_config.name
    assert good["files"] == builder.source_files
    assert "multi30k-train.array_record-00000-of-00001" in good["prepared_files"]

    def other_train_file(record):  # a record of another train.en.gz, consistent with itself
        record["files"]["train.en.gz"]["sha256"] = "0" * 64
        record["fingerprint"] = fingerprint.fingerprint(record["files"])

    tampering = {
        "train.en.gz (sha256 000000000000 there": other_train_file,
        "does not match its own file list": lambda record: record.update(fingerprint="sha256:" + "1" * 64),
        "was written for 'files-": lambda record: record.update(config="files-000000000000"),
    }
    for expected, edit in tampering.items():
        _tamper_record(builder, edit)
        caplog.clear()
        again = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
        with caplog.at_level(logging.WARNING):
            assert read_split(again) == [f"train en user sentence {i}" for i in range(3)]
        warnings = [
            r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "multi30k" in r.getMessage()
        ]
        assert len(warnings) == 1, warnings
        assert again.data_dir in warnings[0] and expected in warnings[0] and "preparing it again" in warnings[0]
        assert _record(again)["files"] == good["files"]  # prepared again, with a true record

    # A record of an older jaxformer (the prepared files' sizes, not their SHA-256): its bytes cannot
    # be checked, so it is prepared again once, and recorded in full.
    _tamper_record(builder, lambda record: record.pop("prepared_sha256"))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert read_split(get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))) == [
            f"train en user sentence {i}" for i in range(3)
        ]
    assert "records no SHA-256 of the prepared files (an older jaxformer's); preparing it again" in caplog.text
    assert "multi30k-train.array_record-00000-of-00001" in _record(builder)["prepared_sha256"]

    # A missing record (preparation cut short after tfds renamed the directory) or a damaged
    # prepared file: prepared again too.
    shard = builder.data_path / "multi30k-train.array_record-00000-of-00001"
    for damage, expected in (
        (lambda: (builder.data_path / fingerprint.RECORD_NAME).unlink(), "is missing"),
        (lambda: shard.write_bytes(shard.read_bytes()[:-5]), str(shard)),
    ):
        damage()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            again = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
            assert read_split(again) == [f"train en user sentence {i}" for i in range(3)]
        assert any(expected in r.getMessage() and "preparing it again" in r.getMessage() for r in caplog.records)
        assert fingerprint.prepared_differences(again.data_path, _record(again)) == []

    caplog.clear()  # a sound copy is used as it is, quietly
    with caplog.at_level(logging.WARNING):
        read_split(get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw))))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "multi30k" in r.getMessage()]


def test_files_changed_while_preparing_are_an_error(tmp_path, monkeypatch):
    raw = write_corpus(tmp_path / "raw")
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    real = multi30k.read_parallel_lines

    def read_then_edit(english, german, *args):
        yield from real(english, german, *args)
        if english.name == "val.en.gz":
            write_corpus(raw, template="{prefix} {language} edited {i}")

    monkeypatch.setattr(multi30k, "read_parallel_lines", read_then_edit)
    with pytest.raises(DataError, match=r"files changed while Multi30k was prepared .*train\.en\.gz"):
        builder.download_and_prepare()
    assert not (builder.data_path / fingerprint.RECORD_NAME).exists()  # never used as it is


def test_download_fingerprints_the_downloaded_files(tmp_path, monkeypatch):
    raw = write_corpus(tmp_path / "official")
    fetched = []

    def fake_download(self, urls):
        fetched.append(urls)
        return {name: str(raw / url.rsplit("/", 1)[1]) for name, url in urls.items()}

    monkeypatch.setattr(tfds.download.DownloadManager, "download", fake_download)
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), download=True))
    assert builder.builder_config.name.startswith("download-") and builder.fingerprint is None
    assert read_split(builder) == [f"train en user sentence {i}" for i in range(3)]
    assert len(fetched) == 1 and fetched[0]["train.en.gz"] == multi30k.DOWNLOAD_URL.format(
        prefix="train", language="en"
    )
    local = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    assert builder.fingerprint == local.fingerprint  # same bytes, same fingerprint
    assert _record(builder)["fingerprint"] == builder.fingerprint

    again = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), download=True))  # reused, from the record
    assert read_split(again, "validation") == [f"val en user sentence {i}" for i in range(3)]
    assert again.fingerprint == builder.fingerprint and len(fetched) == 1


def test_builder_pickles_with_its_source(tmp_path):
    raw = write_corpus(tmp_path / "raw")
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    copy = pickle.loads(pickle.dumps(builder))
    assert copy.data_dir == builder.data_dir and copy.fingerprint == builder.fingerprint
