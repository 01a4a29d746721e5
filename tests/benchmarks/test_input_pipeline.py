"""benchmarks.input_pipeline: its rows, and that the step it feeds is multi30k's own."""

import pytest

from benchmarks import input_pipeline
from jaxformer.configs import multi30k
from tests.benchmarks.test_smoke import smoke_output


@pytest.mark.slow  # about 13 s: the default suite is near its 10-minute limit
def test_smoke_feeds_multi30ks_own_train_step(tmp_path, capsys, monkeypatch):
    built = []

    class Recorded(input_pipeline.ConfigTrainStep):
        def __init__(self, config, *args, **kwargs):
            built.append(self)
            super().__init__(config, *args, **kwargs)
            self.config = config

    monkeypatch.setattr(input_pipeline, "ConfigTrainStep", Recorded)
    rows, output = smoke_output("input_pipeline", tmp_path, capsys)
    assert [row["pipeline"] for row in rows] == list(input_pipeline.PIPELINES)
    (step,) = built
    # The config's training and optimizer sections, R-Drop included, and its separate vocabularies
    # (the smoke changes only sizes); not the experiment defaults' step on one joint tokenizer.
    want = multi30k.get_config()
    assert step.rdrop and step.config.training == want.training and step.config.optimizer == want.optimizer
    assert step.config.tokenizer.separate_vocabularies and not step.config.model.share_embeddings
    assert {"source_embedding", "target_embedding"} <= set(step.state.params)
    assert "300-piece en and 300-piece de tokenizers" in output
    assert f"R-Drop alpha {want.training.rdrop_alpha}, weight decay {want.optimizer.weight_decay}" in output
