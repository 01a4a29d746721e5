"""Word dropout (model.source_word_dropout_rate, model.target_word_dropout_rate): whole token
embeddings dropped in training, checked against the deterministic model fed zero embeddings at
the dropped positions."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.config import ConfigError, preset
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.model.dropout import Dropout
from jaxformer.model.transformer import Transformer

# Separate source and target tables and an untied output projection, so that scaling an input
# table changes nothing but that input. Tokens are drawn below ZERO_ID, whose row is zeroed.
CONFIG = preset("tiny", dropout_rate=0.0, share_embeddings=False, tie_output_embedding=False)
ZERO_ID = CONFIG.vocab_size - 1
RATE = 0.3


def word_dropout(rate):
    return Dropout(rate, broadcast_dims=(-1,))


def _capture_word_dropouts(module, method):
    return module.name == "word_dropout"


def _dropped(intermediates, stack):
    """[B, L]: where the stack's word dropout zeroed the whole embedding."""
    (embedded,) = intermediates[stack]["word_dropout"]["__call__"]
    return np.asarray((embedded == 0).all(axis=-1))


def test_whole_tokens_are_dropped_at_the_rate_and_the_rest_scaled():
    embedded = jax.random.normal(jax.random.key(0), (64, 128, 16))
    out = np.asarray(word_dropout(0.25).apply({}, embedded, deterministic=False, rngs={"dropout": jax.random.key(1)}))
    dropped = (out == 0).all(axis=-1)  # [B, L]
    np.testing.assert_allclose(out[~dropped], np.asarray(embedded)[~dropped] / 0.75, rtol=1e-6)
    assert ((out == 0).any(axis=-1) == dropped).all()  # no token partly dropped
    assert abs(dropped.mean() - 0.25) < 0.025  # 8,192 tokens: 5 standard deviations is 0.024
    other_key = word_dropout(0.25).apply({}, embedded, deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert not np.array_equal((np.asarray(other_key) == 0).all(axis=-1), dropped)
    np.testing.assert_array_equal(word_dropout(0.25).apply({}, embedded, deterministic=True), embedded)
    np.testing.assert_array_equal(word_dropout(0.0).apply({}, embedded, deterministic=False), embedded)


def _setup(seed):
    source = jax.random.randint(jax.random.key(seed), (3, 9), 4, ZERO_ID)
    target = jax.random.randint(jax.random.key(seed + 1), (3, 7), 4, ZERO_ID)
    params = Transformer(CONFIG).init(jax.random.key(seed + 2), source, target, deterministic=True)["params"]
    return source, target, nn.unbox(params)


def _train_apply(config, params, source, target, seed):
    """Training-mode logits, and which positions the word dropouts dropped on each side."""
    logits, state = Transformer(config).apply(
        {"params": params},
        source,
        target,
        rngs={"dropout": jax.random.key(seed)},
        capture_intermediates=_capture_word_dropouts,
    )
    intermediates = state["intermediates"]
    return logits, {
        stack: _dropped(intermediates, stack) for stack in intermediates if "word_dropout" in intermediates[stack]
    }


def _zeroed_and_scaled(params, table, scale):
    """`params` with the named input table scaled and its ZERO_ID row set to zero."""
    embedding = params[table]["embedding"] * scale
    return {**params, table: {"embedding": embedding.at[ZERO_ID].set(0.0)}}


@pytest.mark.parametrize("side", ["source", "target"])
def test_training_equals_the_deterministic_model_with_the_dropped_tokens_zeroed(side):
    source, target, params = _setup(seed=3)
    config = CONFIG.replace(**{f"{side}_word_dropout_rate": RATE})
    logits, dropped = _train_apply(config, params, source, target, seed=4)
    stack = "encoder" if side == "source" else "decoder"
    assert set(dropped) == {stack}
    assert 0 < dropped[stack].sum() < dropped[stack].size
    reference_params = _zeroed_and_scaled(params, f"{side}_embedding", 1.0 / (1.0 - RATE))
    if side == "source":
        source = jnp.where(dropped[stack], ZERO_ID, source)
    else:
        target = jnp.where(dropped[stack], ZERO_ID, target)
    reference = Transformer(CONFIG).apply({"params": reference_params}, source, target, deterministic=True)
    np.testing.assert_allclose(logits, reference, atol=1e-5)


def test_both_sides_draw_their_own_masks_and_evaluation_ignores_them():
    source, target, params = _setup(seed=5)
    config = CONFIG.replace(source_word_dropout_rate=RATE, target_word_dropout_rate=RATE)
    _, dropped = _train_apply(config, params, source, target, seed=6)
    _, again = _train_apply(config, params, source, target, seed=7)
    assert set(dropped) == {"encoder", "decoder"}
    assert not np.array_equal(dropped["encoder"], again["encoder"])
    assert not np.array_equal(dropped["decoder"], again["decoder"])
    evaluation = Transformer(config).apply({"params": params}, source, target, deterministic=True)
    without = Transformer(CONFIG).apply({"params": params}, source, target, deterministic=True)
    np.testing.assert_array_equal(evaluation, without)
    # The parameters are those of the model without it: checkpoints move between the two.
    initialised = nn.unbox(Transformer(config).init(jax.random.key(0), source, target, deterministic=True))
    assert jax.tree.structure(initialised) == jax.tree.structure({"params": params})


def test_rates_are_checked_and_apply_only_where_the_side_exists():
    with pytest.raises(ConfigError, match=r"source_word_dropout_rate=1.0.*\[0, 1\)"):
        preset("tiny", source_word_dropout_rate=1.0)
    with pytest.raises(ConfigError, match=r"target_word_dropout_rate=-0.1"):
        preset("tiny", target_word_dropout_rate=-0.1)
    with pytest.raises(ConfigError, match=r"source_word_dropout_rate=0.1: architecture='decoder_only' has no source"):
        preset("tiny", architecture="decoder_only", source_word_dropout_rate=0.1)
    with pytest.raises(ConfigError, match=r"target_word_dropout_rate=0.1: architecture='encoder_only' has no decoder"):
        preset("tiny", architecture="encoder_only", target_word_dropout_rate=0.1)


def test_a_decoder_only_model_drops_its_input_tokens():
    config = CONFIG.replace(architecture="decoder_only", share_embeddings=True)
    tokens = jax.random.randint(jax.random.key(8), (3, 9), 4, ZERO_ID)
    params = nn.unbox(DecoderOnly(config).init(jax.random.key(9), tokens, deterministic=True)["params"])
    logits, state = DecoderOnly(config.replace(target_word_dropout_rate=RATE)).apply(
        {"params": params},
        tokens,
        rngs={"dropout": jax.random.key(10)},
        capture_intermediates=_capture_word_dropouts,
    )
    dropped = _dropped(state["intermediates"], "decoder")  # [B, T]
    assert 0 < dropped.sum() < dropped.size
    reference_params = _zeroed_and_scaled(params, "embedding", 1.0 / (1.0 - RATE))
    reference = DecoderOnly(config).apply(
        {"params": reference_params}, jnp.where(dropped, ZERO_ID, tokens), deterministic=True
    )
    np.testing.assert_allclose(logits, reference, atol=1e-5)
