"""The whole models against PyTorch's: the translator against a torch.nn.Transformer of the paper
and the decoder-only model against a causal torch.nn.TransformerEncoder (benchmarks/
torch_reference.py's TorchTransformer and TorchLanguageModel), every weight copied over, logits
compared at every real target position of padded batches."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from jaxformer.model.architectures import build_model
from jaxformer.model.config import preset
from jaxformer.tokens import BOS_ID, NUM_SPECIAL_TOKENS, PAD_ID
from tests.model.torch_weights import assign, load_stack

torch = pytest.importorskip("torch")

from benchmarks import torch_reference  # noqa: E402  (imports torch)

# Both sides compute in float32 but sum in different orders (torch's packed QKV projection, its
# own LayerNorm and softmax kernels): over these cases the largest difference was 2.1e-6, on logits
# of up to 4.6 (2026-12-06, torch 2.13 on CPU). 1e-5 leaves room for another CPU's kernels; a weight
# copied wrong or a formula changed moves the logits by far more (see docs/test_suite.md).
TOLERANCE = 1e-5
# (real lengths, width) of each side's rows: a padded batch, or one row of one token.
SOURCE_ROWS = {"padded": ((5, 7, 2), 7), "one_token": ((1,), 1)}
TARGET_ROWS = {"padded": ((6, 3, 1), 6), "one_token": ((1,), 1)}  # BOS first
LANGUAGE_MODEL_ROWS = {"padded": ((8, 5, 1), 8), "one_token": ((1,), 1)}

TRANSLATOR_CASES = {  # name: (config overrides, batch)
    "post_norm": ({}, "padded"),
    "pre_norm": ({"normalization": "pre"}, "padded"),
    "pre_norm_gelu": ({"normalization": "pre", "activation": "gelu"}, "padded"),
    "swish_epsilon": ({"activation": "swish", "layer_norm_epsilon": 1e-5}, "padded"),
    "separate_embeddings": ({"share_embeddings": False, "source_vocab_size": 50}, "padded"),
    "untied_logits_bias": ({"tie_output_embedding": False, "logits_bias": True}, "padded"),
    "depths_3_1_d_ff_50": ({"num_encoder_layers": 3, "num_decoder_layers": 1, "d_ff": 50}, "padded"),
    "depths_1_3_pre_norm": ({"num_encoder_layers": 1, "num_decoder_layers": 3, "normalization": "pre"}, "padded"),
    "halves_positions": ({"position_layout": "halves", "position_base": 100.0}, "padded"),
    "one_token": ({}, "one_token"),
    "one_token_pre_norm": ({"normalization": "pre"}, "one_token"),
}
LANGUAGE_MODEL_CASES = {
    "post_norm": ({}, "padded"),
    "pre_norm": ({"normalization": "pre"}, "padded"),
    "pre_norm_untied_gelu": ({"normalization": "pre", "tie_output_embedding": False, "activation": "gelu"}, "padded"),
    "three_layers_d_ff_50": ({"num_decoder_layers": 3, "d_ff": 50}, "padded"),
    "one_token": ({}, "one_token"),
}
# The rest are slow: each case compiles its own program, about 1.3 s cold on 2 cores (the file: 22 s).
DEFAULT_SUITE = ("post_norm", "pre_norm")


def cases(table):
    return [
        pytest.param(overrides, batch, id=name, marks=() if name in DEFAULT_SUITE else pytest.mark.slow)
        for name, (overrides, batch) in table.items()
    ]


def padded_tokens(seed, vocab_size, rows, first=None):
    """[len(lengths), width] random ids for `rows` = (lengths, width), each row padded after its length."""
    lengths, width = rows
    tokens = np.random.default_rng(seed).integers(NUM_SPECIAL_TOKENS, vocab_size, (len(lengths), width))
    if first is not None:
        tokens[:, 0] = first
    tokens[np.arange(width) >= np.array(lengths)[:, None]] = PAD_ID
    return tokens


def random_params(config, *inputs):
    """Random values in the shapes of the model's parameters: LayerNorm scales about 1 and biases
    about 0 but neither exactly (a scale or bias copied to the wrong place, or left out, changes
    the torch model's logits), the rest of a size that keeps activations and logits of order 1.
    Drawn by numpy from the shapes: the model's initialisation would compile a second program."""
    shapes = nn.meta.unbox(jax.eval_shape(build_model(config).init, jax.random.key(0), *inputs)["params"])
    rng = np.random.default_rng(3)

    def draw(path, shape):
        noise = rng.normal(0.0, 0.2, shape.shape).astype(np.float32)
        return 1.0 + noise / 2 if jax.tree_util.keystr(path).endswith("['scale']") else noise

    return jax.tree_util.tree_map_with_path(draw, shapes)


def jaxformer_logits(config, params, *inputs):
    model = build_model(config)
    return np.asarray(jax.jit(lambda params, *inputs: model.apply({"params": params}, *inputs))(params, *inputs))


def load_output(output, config, decoder_params):
    if not config.tie_output_embedding:
        assign(output.weight, decoder_params["logits_kernel"], transpose=True)
    if config.logits_bias:
        assign(output.bias, decoder_params["logits_bias"])


def torch_translator(config, params, max_length):
    model = torch_reference.TorchTransformer(config, max_length)
    load_stack(model.transformer.encoder, params["encoder"])
    load_stack(model.transformer.decoder, params["decoder"])
    if config.share_embeddings:
        assign(model.target_embedding.table.weight, params["shared_embedding"]["embedding"])
    else:
        assign(model.source_embedding.table.weight, params["source_embedding"]["embedding"])
        assign(model.target_embedding.table.weight, params["target_embedding"]["embedding"])
    load_output(model.output, config, params["decoder"])
    return model.eval()


def torch_language_model(config, params, max_length):
    model = torch_reference.TorchLanguageModel(config, max_length)
    load_stack(model.layers, params["decoder"])
    assign(model.embedding.table.weight, params["embedding"]["embedding"])
    load_output(model.output, config, params["decoder"])
    return model.eval()


def torch_logits(model, *inputs):
    with torch.no_grad():
        return model(*(torch.from_numpy(array) for array in inputs)).numpy()


def assert_close_at_real_targets(logits, expected, target):
    real = target != PAD_ID  # a padding position's logits are used by neither side
    assert real.any() and np.isfinite(expected[real]).all()
    np.testing.assert_allclose(logits[real], expected[real], atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("overrides, batch", cases(TRANSLATOR_CASES))
def test_the_translator_computes_a_torch_transformer_with_its_weights(overrides, batch):
    config = preset("tiny", dropout_rate=0.0, deterministic=True, **overrides)
    source = padded_tokens(0, config.encoder_vocab_size, SOURCE_ROWS[batch])
    target = padded_tokens(1, config.vocab_size, TARGET_ROWS[batch], first=BOS_ID)
    params = random_params(config, source, target)
    logits = jaxformer_logits(config, params, source, target)
    expected = torch_logits(torch_translator(config, params, max(source.shape[1], target.shape[1])), source, target)
    assert_close_at_real_targets(logits, expected, target)


@pytest.mark.parametrize("overrides, batch", cases(LANGUAGE_MODEL_CASES))
def test_the_decoder_only_model_computes_a_causal_torch_encoder_with_its_weights(overrides, batch):
    config = preset("tiny", architecture="decoder_only", dropout_rate=0.0, deterministic=True, **overrides)
    target = padded_tokens(2, config.vocab_size, LANGUAGE_MODEL_ROWS[batch], first=BOS_ID)
    params = random_params(config, target)
    logits = jaxformer_logits(config, params, target)
    expected = torch_logits(torch_language_model(config, params, target.shape[1]), target)
    assert_close_at_real_targets(logits, expected, target)
