"""Incremental decoding with the explicit KV cache equals the full teacher-forced forward pass."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from jaxformer.model.cache import init_cache
from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer, unstack_layers
from jaxformer.tokens import BOS_ID, PAD_ID

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("cache")

TINY = preset("tiny", deterministic=True)
B, S, T = 3, 7, 6


def init_params(config):
    source, target = jnp.ones((1, S), jnp.int32), jnp.ones((1, T), jnp.int32)
    return nn.meta.unbox(jax.jit(Transformer(config).init)(jax.random.key(0), source, target)["params"])


def padded_source(vocab_size):
    source = jax.random.randint(jax.random.key(1), (B, S), 4, vocab_size)
    return source.at[0, 4:].set(PAD_ID).at[2, 2:].set(PAD_ID)  # rows of 4, 7 and 2 real tokens


def decoder_inputs(key, rows, vocab_size):
    tokens = jax.random.randint(key, (rows, T - 1), 4, vocab_size)
    return jnp.concatenate([jnp.full((rows, 1), BOS_ID), tokens], axis=1)  # [R, T]


def cached_logits(model, params, source, inputs, max_length):
    """Logits [R, T, V] from one decode_step per position, jitted."""
    context = jax.jit(lambda p, s: model.apply({"params": p}, s, method=Transformer.encoder_context))(params, source)
    cache = init_cache(model.config, inputs.shape[0], max_length)
    step = jax.jit(
        lambda p, tokens, cache, context: model.apply(
            {"params": p}, tokens, cache, context, method=Transformer.decode_step
        )
    )
    logits = []
    for position in range(inputs.shape[1]):
        step_logits, cache = step(params, inputs[:, position : position + 1], cache, context)
        logits.append(step_logits)
        assert int(cache.index) == position + 1
    return jnp.stack(logits, axis=1)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"normalization": "pre"}, {"tie_output_embedding": False, "share_embeddings": False}],
    ids=["post-norm", "pre-norm", "untied"],
)
def test_cached_steps_equal_the_full_forward_pass(overrides):
    config = TINY.replace(**overrides)
    model, params = Transformer(config), init_params(config)
    source = padded_source(config.vocab_size)
    inputs = decoder_inputs(jax.random.key(2), B, config.vocab_size)
    full = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t))(params, source, inputs)  # [B, T, V]
    # A cache longer than the output: unused positions must stay invisible.
    stepped = cached_logits(model, params, source, inputs, max_length=T + 5)
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=1e-5)


def test_hypotheses_share_their_source_context():
    """K rows per source (as in beam search) read one copy of the cross-attention keys."""
    K = 4
    model, params = Transformer(TINY), init_params(TINY)
    source = padded_source(TINY.vocab_size)
    inputs = decoder_inputs(jax.random.key(3), B * K, TINY.vocab_size)  # a different prefix per hypothesis
    repeated_source = jnp.repeat(source, K, axis=0)  # [B * K, S], source-major like the search
    full = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t))(params, repeated_source, inputs)
    context = model.apply({"params": params}, source, method=Transformer.encoder_context)
    assert context.keys[0].shape[0] == B  # not B * K
    stepped = cached_logits(model, params, source, inputs, max_length=T)
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=1e-5)


def test_scanned_parameters_decode_after_unstacking():
    scanned = TINY.replace(scan_layers=True)
    params = init_params(scanned)
    source = padded_source(TINY.vocab_size)
    inputs = decoder_inputs(jax.random.key(4), B, TINY.vocab_size)
    full = Transformer(scanned).apply({"params": params}, source, inputs)
    with pytest.raises(ValueError, match="unstack"):
        Transformer(scanned).apply({"params": params}, source, method=Transformer.encoder_context)
    unscanned = Transformer(TINY)
    stepped = cached_logits(unscanned, unstack_layers(params), source, inputs, max_length=T)
    np.testing.assert_allclose(stepped, full, atol=1e-5, rtol=1e-5)


def test_a_step_into_a_full_cache_is_refused_and_a_grown_cache_decodes_on():
    """dynamic_update_slice clamps a write past the cache's end onto its last position: an eager
    step there gave wrong logits without a word (refused before any work). A grown cache goes on
    as the full pass."""
    model, params = Transformer(TINY), init_params(TINY)
    source = padded_source(TINY.vocab_size)
    inputs = decoder_inputs(jax.random.key(5), B, TINY.vocab_size)
    full = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t))(params, source, inputs)  # [B, T, V]
    context = jax.jit(lambda p, s: model.apply({"params": p}, s, method=Transformer.encoder_context))(params, source)

    def step(tokens, cache):
        return model.apply({"params": params}, tokens, cache, context, method=Transformer.decode_step)

    jitted_step = jax.jit(step)
    cache = init_cache(TINY, B, 2)
    for position in range(T):
        if position == 2:
            with pytest.raises(ValueError, match=r"^the cache is full: it holds 2 positions and this step writes"):
                step(inputs[:, 2:3], cache)
            cache = cache.grown(T)
        logits, cache = jitted_step(inputs[:, position : position + 1], cache)
        np.testing.assert_allclose(logits, full[:, position], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "rows, max_length, expected",
    [
        (-1, 4, "init_cache's rows must be an integer >= 0, got -1"),
        (2, 0, "init_cache's max_length must be an integer >= 1, got 0"),
        (2, 3.5, "init_cache's max_length must be an integer >= 1, got 3.5"),
        (True, 4, "init_cache's rows must be an integer >= 0, got True"),
    ],
    ids=["negative rows", "no positions", "a float length", "a bool"],
)
def test_a_cache_of_no_size_or_a_size_of_another_kind_is_refused_naming_it(rows, max_length, expected, monkeypatch):
    """jax refused these shapes naming neither argument ("broadcast_in_dim shape must have every
    element be nonnegative"; "Shapes must be 1D sequences of concrete values of integer type"), a
    bool passed as 1 row, and a cache of 0 positions was refused only at its first step."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # the suite's hook, not a user's
    with pytest.raises(ValueError) as error:
        init_cache(TINY, rows, max_length)
    assert str(error.value) == expected
    assert init_cache(TINY, np.int64(0), np.int64(3)).keys[0].shape == (0, TINY.num_heads, 3, TINY.head_dim)


@pytest.mark.parametrize(
    "max_length, expected",
    [
        (8.0, "grown's max_length must be an integer >= 1, got 8.0"),
        (True, "grown's max_length must be an integer >= 1, got True"),
    ],
    ids=["a float length", "a bool"],
)
def test_a_cache_grown_to_a_length_of_another_kind_is_refused_naming_it(max_length, expected, monkeypatch):
    """As init_cache refuses it: jnp.pad refused a float naming no argument ("`pad_width` must be of
    integral type"), and a bool was taken for the length 1 (`cannot shrink to True`)."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # the suite's hook, not a user's
    cache = init_cache(TINY, 2, 4)
    with pytest.raises(ValueError) as error:
        cache.grown(max_length)
    assert str(error.value) == expected
    assert cache.grown(np.int64(8)).max_length == 8
