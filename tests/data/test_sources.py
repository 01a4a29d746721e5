import gzip

import pytest
import tensorflow_datasets as tfds

from jaxformer.data import multi30k
from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import eval_batches
from jaxformer.data.sources import get_builder, load_split
from jaxformer.data.tokenizer import train_tokenizer


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


def test_multi30k_builder_keeps_order_and_splits(tmp_path):
    raw = write_raw_corpus(tmp_path / "raw")
    builder = get_builder("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw))
    source = load_split(builder, "test_2016_flickr", ("en", "de"))
    assert len(source) == 3
    assert [source[i]["en"] for i in range(3)] == [f"test_2016_flickr en sentence {i}".encode() for i in range(3)]
    assert set(builder.info.splits) == set(multi30k.SPLIT_FILES)
    assert builder.info.file_format.value == "array_record"
    with pytest.raises(DataError, match="no split 'test_2019'"):
        load_split(builder, "test_2019", ("en", "de"))
    with pytest.raises(DataError, match="no language 'fr'"):
        load_split(builder, "train", ("en", "fr"))


def test_multi30k_builder_reports_bad_files(tmp_path):
    raw = write_raw_corpus(tmp_path / "raw", broken=(("val", "de"), lambda lines: lines[:-1]))
    builder = get_builder("multi30k", data_dir=str(tmp_path / "tfds"), raw_dir=str(raw))
    with pytest.raises(DataError, match=r"val\.en\.gz has 3 lines, .*val\.de\.gz has 2"):
        builder.download_and_prepare()
    (raw / "train.en.gz").unlink()
    with pytest.raises(DataError, match=r"not found: .*train\.en\.gz"):
        get_builder("multi30k", data_dir=str(tmp_path / "tfds2"), raw_dir=str(raw)).download_and_prepare()


def test_vendored_multi30k_is_complete(tmp_path):
    counts = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000, "test_2017_flickr": 1_000,
              "test_2017_mscoco": 461, "test_2018_flickr": 1_071}
    for prefix, count in counts.items():
        for language in multi30k.LANGUAGES:
            with gzip.open(multi30k.VENDORED_DIR / f"{prefix}.{language}.gz", "rt", encoding="utf-8") as handle:
                assert sum(1 for _ in handle) == count, (prefix, language)
    assert "Elliott" in (multi30k.VENDORED_DIR / "README.md").read_text()


def test_wmt_builders_through_tfds_mock_data():
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        builder = get_builder("wmt14_translate/de-en", data_dir=None)
        assert set(builder.info.features.keys()) == {"de", "en"}
        source = load_split(builder, "train", ("en", "de"))
        assert len(source) == 6
        records = [source[i] for i in range(6)]
    tokenizer = train_tokenizer([r[k] for r in records for k in ("en", "de")] * 20, vocab_size=30)
    batches = eval_batches(records, tokenizer, source_language="de", target_language="en", max_length=64, batch_size=2)
    assert batches and batches[0]["inputs"].shape == (2, 64)
    assert int(sum((b["inputs_segment_ids"].max(axis=1)).sum() for b in batches)) == 6


def test_raw_dir_is_for_multi30k_only():
    with pytest.raises(DataError, match="multi30k only"):
        get_builder("wmt17_translate/de-en", raw_dir="/somewhere")
