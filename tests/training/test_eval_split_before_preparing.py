"""A run checks both split keys before it prepares either: a wmt*_translate dataset is prepared
(hours of downloading) when its training split is read, so an eval_split it has not was refused
only after that."""

import pytest

from jaxformer.data import sources
from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import get_builder
from jaxformer.training import run_start
from tests.data.test_sources import section


def test_a_wmt_eval_split_it_has_not_is_refused_before_the_training_split_is_prepared(tmp_path, monkeypatch):
    def no_preparation(builder):
        raise AssertionError("the dataset was prepared")

    monkeypatch.setattr(sources, "prepare", no_preparation)
    monkeypatch.setattr(run_start, "prepare", no_preparation)
    data = section("wmt14_translate/de-en", data_dir=str(tmp_path / "tfds"), eval_split="nosuch")
    expected = (
        "^config data.eval_split='nosuch': dataset 'wmt14_translate' has no split 'nosuch'; "
        "it has train, validation, test$"
    )
    with pytest.raises(DataError, match=expected):
        run_start.prepare_data(data, get_builder(data), ("de", "en"))
