"""benchmarks/torch_reference.py: the torch model is jaxformer's, weight for weight."""

import pytest

from benchmarks.common import random_batch, random_params
from jaxformer.model.config import preset
from jaxformer.training.state import count_parameters


@pytest.mark.parametrize(
    "overrides",
    [{}, {"share_embeddings": False, "source_vocab_size": 50}],  # one embedding; separate vocabularies (multi30k's)
    ids=["shared", "separate"],
)
def test_the_torch_translator_has_jaxformers_parameter_count(overrides):
    pytest.importorskip("torch")
    from benchmarks.train_step import torch_step

    config = preset("tiny", **overrides)
    batch = random_batch(0, config.encoder_vocab_size, 2, 6, 5)  # source ids within the source vocabulary
    torch_count, step = torch_step(config, batch)
    assert torch_count == count_parameters(random_params(config))
    assert step().isfinite()  # the source side reads its own embedding's rows
