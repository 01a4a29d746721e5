"""benchmarks/torch_reference.py: the torch model is jaxformer's, weight for weight."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.common import random_batch
from jaxformer.model.architectures import build_model
from jaxformer.model.config import preset
from jaxformer.model.layers import activation_function
from jaxformer.model.position import sinusoidal_table
from jaxformer.tokens import NUM_SPECIAL_TOKENS
from jaxformer.training.objectives import objective_for
from jaxformer.training.state import count_parameters, init_params

torch = pytest.importorskip("torch")

SEPARATE = {"share_embeddings": False, "source_vocab_size": 50}  # separate vocabularies (multi30k's)
DECODER_ONLY = {"architecture": "decoder_only"}


def jaxformer_count(config) -> int:
    """Counted on the parameters' shapes (no initialisation run: the same tree, at a fraction of the time)."""
    return count_parameters(jax.eval_shape(lambda: init_params(build_model(config), jax.random.key(0), 4, 4)))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        SEPARATE,
        {"normalization": "pre"},
        {**DECODER_ONLY, "normalization": "pre"},
        {"tie_output_embedding": False},
        {**SEPARATE, "tie_output_embedding": False},
        {**DECODER_ONLY, "tie_output_embedding": False},
        {"logits_bias": True},
        {"logits_bias": True, "tie_output_embedding": False},
        {"activation": "swish"},
        {"activation": "squared_relu"},
        {**DECODER_ONLY, "activation": "squared_relu", "normalization": "pre"},
    ],
    ids=[
        "shared",
        "separate",
        "pre_norm",
        "pre_norm_decoder_only",
        "untied",
        "untied_separate",
        "untied_decoder_only",
        "logits_bias",
        "logits_bias_untied",
        "swish",
        "squared_relu",
        "squared_relu_pre_norm_decoder_only",
    ],
)
def test_the_torch_model_has_jaxformers_parameter_count(overrides):
    from benchmarks.train_step import torch_step

    config = preset("tiny", **overrides)
    batch = random_batch(0, config, 2, 6, 5, objective_for(config).features)
    torch_count, step = torch_step(config, batch)
    assert torch_count == jaxformer_count(config)
    assert step().isfinite()  # the source side reads its own embedding's rows


def stacks(model):
    """The reference's nn.TransformerEncoder / nn.TransformerDecoder stacks."""
    return [
        module
        for module in model.modules()
        if isinstance(module, (torch.nn.TransformerEncoder, torch.nn.TransformerDecoder))
    ]


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only"])
def test_pre_norm_layers_normalise_first_and_every_stack_ends_in_a_layer_norm(architecture):
    from benchmarks import torch_reference as reference

    config = preset("tiny", architecture=architecture, normalization="pre", layer_norm_epsilon=1e-5)
    model = reference.MODELS[architecture](config)
    assert len(stacks(model)) == (2 if architecture == "encoder_decoder" else 1)
    for stack in stacks(model):
        assert all(layer.norm_first for layer in stack.layers)
        assert isinstance(stack.norm, torch.nn.LayerNorm) and stack.norm.eps == 1e-5


@pytest.mark.parametrize("activation", ["swish", "squared_relu"])
def test_the_feed_forward_computes_jaxformers_activation(activation):
    from benchmarks import torch_reference as reference

    x = np.linspace(-4.0, 4.0, 17, dtype=np.float32)
    expected = np.asarray(activation_function(activation)(jnp.asarray(x)))
    for architecture in ("encoder_decoder", "decoder_only"):
        model = reference.MODELS[architecture](preset("tiny", architecture=architecture, activation=activation))
        for stack in stacks(model):
            for layer in stack.layers:
                np.testing.assert_allclose(
                    layer.activation(torch.from_numpy(x)).numpy(), expected, rtol=1e-6, atol=1e-7
                )


@pytest.mark.parametrize(
    "overrides",
    [{"position_layout": "halves"}, {"position_base": 100.0}, {"position_layout": "halves", **DECODER_ONLY}],
)
def test_the_positional_encoding_is_jaxformers(overrides):
    from benchmarks import torch_reference as reference

    config = preset("tiny", **overrides)
    model = reference.MODELS[config.architecture](config, max_length=12)
    expected = sinusoidal_table(12, config.d_model, config.position_base, config.position_layout)
    tables = [buffer for name, buffer in model.named_buffers() if name.endswith("positions")]
    assert tables
    for table in tables:
        np.testing.assert_array_equal(table.numpy(), expected)


@pytest.mark.parametrize(
    "overrides",
    [
        {"source_word_dropout_rate": 0.5},
        {"target_word_dropout_rate": 0.5},
        {"target_word_dropout_rate": 0.5, **DECODER_ONLY},
    ],
    ids=["source", "target", "decoder_only"],
)
def test_word_dropout_draws_a_new_mask_each_training_call(overrides):
    from benchmarks import torch_reference as reference

    # Every other dropout off: only word dropout can make two training calls differ.
    config = preset("tiny", dropout_rate=0.0, **overrides)
    model = reference.MODELS[config.architecture](config).train()
    tokens = torch.randint(NUM_SPECIAL_TOKENS, config.vocab_size, (4, 8))
    inputs = (tokens, tokens) if config.architecture == "encoder_decoder" else (tokens,)
    torch.manual_seed(0)
    first = model(*inputs)
    torch.manual_seed(1)
    assert not torch.allclose(first, model(*inputs))
    model.eval()  # and none outside training
    assert torch.equal(model(*inputs), model(*inputs))


@pytest.mark.parametrize(
    "model, architecture",
    [
        ("TorchTransformer", "encoder_only"),
        ("TorchTransformer", "decoder_only"),
        ("TorchLanguageModel", "encoder_only"),
        ("TorchLanguageModel", "encoder_decoder"),
    ],
)
def test_a_config_the_reference_does_not_mirror_is_refused_when_it_is_built(model, architecture):
    from benchmarks import torch_reference as reference

    config = preset("tiny", architecture=architecture)
    with pytest.raises(ValueError, match=rf"^torch reference: architecture='{architecture}' is not mirrored"):
        getattr(reference, model)(config)


def test_random_batches_draw_each_side_from_its_own_vocabulary():
    for source_vocab_size in (40, 100):  # below and above the target's 64
        config = preset("tiny", share_embeddings=False, source_vocab_size=source_vocab_size)
        batch = random_batch(0, config, 16, 32, 32)
        for name, size in (("inputs", source_vocab_size), ("targets", config.vocab_size)):
            assert batch[name].min() >= NUM_SPECIAL_TOKENS and batch[name].max() == size - 1, name
