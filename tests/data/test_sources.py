import gzip
import logging
import tempfile

import pytest
import tensorflow_datasets as tfds

from jaxformer.data import multi30k, sources
from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import TokenizePair, eval_batches, read_records
from jaxformer.data.sources import check_source, get_builder, load_split
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.training.experiment import default_config


def section(name, **values):
    """The data section that get_builder reads: the defaults, with `name` and `values`."""
    data = default_config().data
    data.name = name
    for key, value in values.items():
        data[key] = value
    return data


def write_raw_corpus(directory, pairs_per_split=3, broken=None):
    directory.mkdir(parents=True, exist_ok=True)
    for prefix in multi30k.SPLIT_FILES.values():
        for language in multi30k.LANGUAGES:
            lines = [f"{prefix} {language} sentence {i}" for i in range(pairs_per_split)]
            if broken and broken[0] == (prefix, language):
                lines = broken[1](lines)
            with gzip.open(directory / f"{prefix}.{language}.gz", "wt", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
    return directory


def test_multi30k_builder_keeps_order_and_splits(tmp_path, capfd):
    raw = write_raw_corpus(tmp_path / "raw")
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    source = load_split(builder, "test_2016_flickr", ("en", "de"))
    printed = capfd.readouterr()
    assert printed.out == "" and "Dataset multi30k downloaded and prepared" in printed.err  # stdout is for results
    assert len(source) == 3
    assert [source[i]["en"] for i in range(3)] == [f"test_2016_flickr en sentence {i}".encode() for i in range(3)]
    assert set(builder.info.splits) == set(multi30k.SPLIT_FILES)
    assert builder.info.file_format.value == "array_record"
    with pytest.raises(DataError, match="no split 'test_2019'"):
        load_split(builder, "test_2019", ("en", "de"))
    with pytest.raises(DataError, match="no language 'fr'"):
        load_split(builder, "train", ("en", "fr"))


def test_multi30k_test_outputs_line_up_with_files_that_have_an_empty_side(tmp_path, caplog):
    """A raw_dir whose test file has a line with an empty side: the prepared split leaves it out,
    and evaluate's --output puts each translation on its pair's line, that one empty."""
    from jaxformer.commands import evaluate

    def blank_second(lines):
        return [lines[0], "", *lines[2:]]

    raw = write_raw_corpus(tmp_path / "raw", pairs_per_split=4, broken=(("test_2016_flickr", "de"), blank_second))
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    assert len(load_split(builder, "test_2016_flickr", ("en", "de"))) == 3
    assert builder.file_lines("test_2016_flickr") == ([1, 3, 4], 4)
    assert builder.file_lines("validation") == ([1, 2, 3, 4], 4)
    numbers, total = evaluate._pair_lines(builder, "test_2016_flickr", 3)
    assert (numbers, total) == ([1, 3, 4], 4)

    lines = [f"test_2016_flickr {language} sentence {i}" for language in ("en", "de") for i in range(4)]
    tokenizer = train_tokenizer(lines * 20, vocab_size=25)

    def scored(split, max_examples):  # as evaluate.split_pairs reads a split once the run is loaded
        records = list(read_records(load_split(builder, split, ("en", "de"))))
        numbers, total = evaluate._pair_lines(builder, split, len(records))
        pairs = [(number, record["en"].decode(), record["de"].decode()) for number, record in zip(numbers, records)]
        return evaluate._first_scored(split, pairs, total, max_examples, (tokenizer, tokenizer))

    with caplog.at_level(logging.WARNING):
        sources, _, file_lines = scored("test_2016_flickr", 3)
    assert sources == [f"test_2016_flickr en sentence {i}" for i in (0, 2, 3)]
    assert file_lines == evaluate.FileLines([1, 3, 4], 4)
    said = "skipped 1 pair with an empty side in the first 4 lines of test_2016_flickr (first at line 2 of its files)"
    assert said in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the first pair only: no line of it left out, nothing said
        assert scored("test_2016_flickr", 1)[2] is None
    assert "empty side" not in caplog.text
    assert evaluate._pair_lines(builder, "validation", 4) == ([1, 2, 3, 4], 4)  # every line a pair
    assert scored("validation", None)[2] is None


def test_multi30k_builder_reports_bad_files(tmp_path):
    raw = write_raw_corpus(tmp_path / "raw", broken=(("val", "de"), lambda lines: lines[:-1]))
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw)))
    with pytest.raises(DataError, match=r"val\.en\.gz has 3 lines, .*val\.de\.gz has 2"):
        builder.download_and_prepare()
    (raw / "train.en.gz").unlink()
    with pytest.raises(DataError, match=r"not found: .*train\.en\.gz"):
        get_builder(section("multi30k", data_dir=str(tmp_path / "tfds2"), raw_dir=str(raw))).download_and_prepare()


def test_vendored_multi30k_is_complete(tmp_path):
    counts = {
        "train": 29_000,
        "val": 1_014,
        "test_2016_flickr": 1_000,
        "test_2017_flickr": 1_000,
        "test_2017_mscoco": 461,
        "test_2018_flickr": 1_071,
    }
    for prefix, count in counts.items():
        for language in multi30k.LANGUAGES:
            with gzip.open(multi30k.VENDORED_DIR / f"{prefix}.{language}.gz", "rt", encoding="utf-8") as handle:
                assert sum(1 for _ in handle) == count, (prefix, language)
    assert "Elliott" in (multi30k.VENDORED_DIR / "README.md").read_text()


def test_wmt_builders_through_tfds_mock_data(monkeypatch):
    monkeypatch.setattr(sources, "tensorflow_installed", lambda: True)  # preparing the real data would need it
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        builder = get_builder(section("wmt14_translate/de-en", data_dir=None))
        assert set(builder.info.features.keys()) == {"de", "en"}
        source = load_split(builder, "train", ("en", "de"))
        assert len(source) == 6
        records = [source[i] for i in range(6)]
    tokenizer = train_tokenizer([r[k] for r in records for k in ("en", "de")] * 20, vocab_size=30)
    data = default_config().data
    data.update(dict(source_language="de", target_language="en", max_length=64, eval_batch_size=2))
    batches = eval_batches(records, TokenizePair.for_data(data, tokenizer), data)
    assert batches and batches[0]["inputs"].shape == (2, 64)
    assert int(sum((b["inputs_segment_ids"].max(axis=1)).sum() for b in batches)) == 6


def test_a_split_wmt_has_not_is_refused_naming_what_gave_it_before_anything_is_prepared(tmp_path, monkeypatch):
    """tfds knows a wmt*_translate dataset's splits from its code (its subsets): not after hours of preparing."""

    def no_preparation(builder):
        raise AssertionError("the dataset was prepared")

    monkeypatch.setattr(sources, "prepare", no_preparation)
    builder = get_builder(section("wmt19_translate/de-en", data_dir=str(tmp_path / "tfds")))
    with pytest.raises(DataError, match="^dataset 'wmt19_translate' has no split 'test'; it has train, validation$"):
        load_split(builder, "test", ("de", "en"))
    expected = (
        "^config data.eval_split='test': dataset 'wmt19_translate' has no split 'test'; it has train, validation$"
    )
    with pytest.raises(DataError, match=expected):
        load_split(builder, "test", ("de", "en"), given_as="config data.eval_split='test'")


def test_making_builders_before_their_data_is_prepared_leaves_no_temporary_folders(tmp_path, monkeypatch):
    temporary = tmp_path / "system_tmp"  # tfds's metadata lookup made an empty tmp...tfds folder here per builder
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a b\tc d\ne f\tg h\n", encoding="utf-8")
    sections = [
        section("multi30k", data_dir=str(tmp_path / "tfds")),
        section("parallel_files", data_dir=str(tmp_path / "tfds"), files={"train": str(pairs)}),
        section("wmt14_translate/de-en", data_dir=str(tmp_path / "tfds")),
    ]
    for data in sections:
        builder = get_builder(data)
        assert not builder.data_path.exists()
    assert list(temporary.iterdir()) == []
    assert tempfile.gettempdir() == str(temporary)


def test_a_name_that_names_no_dataset_and_an_unusable_data_dir_are_one_line_errors(tmp_path, monkeypatch):
    for name in ("multi30k", "parallel_files", "wmt14_translate/de-en", "wmt17_translate/de-en:1.0.0"):
        check_source(section(name, data_dir=str(tmp_path / "new" / "data")))
    monkeypatch.setattr(sources, "installed", lambda package: package == "gcsfs")
    check_source(section("wmt14_translate/de-en", data_dir="gs://bucket/tensorflow_datasets"))  # tfds's own path
    monkeypatch.setattr(sources, "installed", lambda package: False)
    monkeypatch.setattr(sources, "tensorflow_installed", lambda: False)
    for name in ("multi30k", "wmt14_translate/de-en"):  # a traceback from tfds once the builder was made
        with pytest.raises(DataError, match=r"^data.data_dir='gs://b/tfds': tensorflow-datasets reaches gs:// "):
            check_source(section(name, data_dir="gs://b/tfds"))
        with pytest.raises(
            DataError, match=r"through gcsfs \(or TensorFlow\), which is not installed: pip install gcsfs$"
        ):
            get_builder(section(name, data_dir="gs://b/tfds"))
    for data_dir in ("file:///data/tfds", "http://example.com/x", "memory://x", "hf://datasets/x"):
        for check in (check_source, get_builder):  # a KeyError or a network traceback from tfds's file API
            with pytest.raises(DataError, match=r"is not a file system the prepared data can be written to; use a "):
                check(section("multi30k", data_dir=data_dir))
    with pytest.raises(DataError, match=r"gs://, s3://, az:// \(give the local path itself\)$"):
        check_source(section("multi30k", data_dir="file:///data/tfds"))
    monkeypatch.undo()
    assert not (tmp_path / "new").exists()  # the check writes nothing
    (tmp_path / "a file").write_text("x")
    (tmp_path / "a link").symlink_to(tmp_path / "unmounted")  # mkdir would fail on it once preparing
    for values, message in (
        (dict(name="bogus_ds"), r"^data.name='bogus_ds' names no dataset: use 'multi30k', 'parallel_files'"),
        (dict(name="None"), r"^data.name='None' names no dataset"),
        (
            dict(name="wmt14_translate/xx-yy"),
            r"^data.name='wmt14_translate/xx-yy': wmt14_translate has no config 'xx-yy'; it has cs-en, de-en,",
        ),
        (  # tfds's default config (cs-en), downloaded without a word
            dict(name="wmt14_translate"),
            r"^data.name='wmt14_translate': wmt14_translate has several configs; name one: wmt14_translate/cs-en, "
            r"wmt14_translate/de-en, wmt14_translate/fr-en, wmt14_translate/hi-en, wmt14_translate/ru-en$",
        ),
        (  # an AssertionError traceback from tfds
            dict(name="wmt14_translate/de-en:9.9.9"),
            r"^data.name='wmt14_translate/de-en:9.9.9': wmt14_translate/de-en has no version '9.9.9'; it has 1.0.0 "
            r"\(or leave the version out\)$",
        ),
        (
            dict(name="wmt14_translate:1.0.0/de-en"),
            r"^data.name='wmt14_translate:1.0.0/de-en' is not a tensorflow-datasets name: give <dataset>/<config>, ",
        ),
        (dict(data_dir=str(tmp_path / "a file")), r"data_dir='.*/a file': is a file, not a folder$"),
        (
            dict(data_dir=str(tmp_path / "a file" / "sub")),
            r"data_dir='.*/a file/sub': .*/a file is a file, not a folder$",
        ),
        (dict(data_dir="/proc/jaxformer-data"), r"data_dir='/proc/jaxformer-data': /proc takes no new entries \("),
        (
            dict(data_dir=str(tmp_path / "a link" / "tfds")),
            r"data_dir='.*/a link/tfds': .*/a link is a link to .*/unmounted, which does not exist$",
        ),
    ):
        with pytest.raises(DataError, match=message):
            check_source(section(values.pop("name", "multi30k"), **values))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a file", "a link"]


def test_a_dataset_with_several_configs_is_refused_without_one(tmp_path):
    with pytest.raises(DataError, match=r"^data.name='wmt17_translate': wmt17_translate has several configs; name one"):
        get_builder(section("wmt17_translate", data_dir=str(tmp_path)))  # evaluate's way in: no check_source
    assert list(tmp_path.iterdir()) == []


def test_raw_dir_is_for_multi30k_only():
    with pytest.raises(DataError, match="multi30k only"):
        get_builder(section("wmt17_translate/de-en", raw_dir="/somewhere"))
