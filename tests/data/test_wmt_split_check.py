"""Checking a wmt*_translate split before preparing reads the subsets from tfds's code, which logs
each one it lists or skips: none of that above the one-line error, tfds's warnings still logged."""

import logging

import pytest

from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import check_split, get_builder
from tests.data.test_sources import section


def test_a_wmt_split_refused_logs_nothing_of_tfds_before_the_error(tmp_path, caplog):
    builder = get_builder(section("wmt14_translate/de-en", data_dir=str(tmp_path / "tfds")))
    absl_filters = list(logging.getLogger("absl").filters)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DataError, match="^config data.eval_split='nosuch': dataset 'wmt14_translate' has no split"):
        check_split(builder, "nosuch", "config data.eval_split='nosuch'")
    check_split(builder, "validation")
    assert [record.getMessage() for record in caplog.records] == []
    assert logging.getLogger("absl").filters == absl_filters  # tfds's logs elsewhere as they were


def test_tfds_warnings_while_checking_are_still_logged(tmp_path, caplog, monkeypatch):
    from absl import logging as absl_logging
    from tensorflow_datasets.translate import wmt

    def subsets_warning(builder):
        absl_logging.warning("a subset's warning")
        return {"train": []}

    monkeypatch.setattr(wmt.WmtTranslate, "subsets", property(subsets_warning))
    builder = get_builder(section("wmt14_translate/de-en", data_dir=str(tmp_path / "tfds")))
    caplog.set_level(logging.DEBUG)
    check_split(builder, "train")
    assert [record.getMessage() for record in caplog.records] == ["a subset's warning"]
