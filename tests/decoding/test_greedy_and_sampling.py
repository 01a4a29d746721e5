"""Greedy search and sampling (greedy_search, sample_search) on test_search.py's tiny random
'model', against its plain-Python references that score every hypothesis from the
full-vocabulary log_softmax, and against the tempered distribution the first token is drawn from."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.search import SearchSpec, greedy_search, sample_search
from tests.decoding.test_search import (
    BANNED,
    BOS,
    EOS,
    LIMITS,
    V,
    allowed_tokens,
    hypothesis,
    initial_cache,
    log_prob,
    next_log_probs,
    tokens_to_logits,
)

# With test_search.py: one worker traces, lowers and fetches the programs they share.
pytestmark = pytest.mark.xdist_group("search")


def test_greedy_takes_the_best_allowed_token_and_scores_it_unrenormalised():
    limits = np.array([6, 2, 4, 1], np.int32)
    tokens, log_probs = greedy_search(
        tokens_to_logits, initial_cache(4), SearchSpec(4, 7, BOS, EOS, limits=jnp.asarray(limits), banned_ids=BANNED)
    )
    for row, limit in enumerate(limits):
        expected = ()
        while not expected or expected[-1] != EOS:
            allowed = allowed_tokens(len(expected), limit)
            scores = next_log_probs(row, expected)
            expected += (max(allowed, key=lambda token: scores[token]),)
        assert hypothesis(tokens[row]) == expected
        assert (np.asarray(tokens[row, len(expected) :]) == 0).all()  # padding after EOS
        np.testing.assert_allclose(log_probs[row], log_prob(row, expected), rtol=1e-5)


def test_sampled_scores_are_untempered_log_probs():
    rows = 64
    limits = np.tile(np.array([6, 2, 4, 3], np.int32), rows // 4)
    cache = {"hash": jnp.zeros((rows,), jnp.int32), "row": jnp.arange(rows, dtype=jnp.int32) % 4}
    tokens, log_probs = jax.jit(
        lambda rng: sample_search(
            tokens_to_logits,
            cache,
            SearchSpec(rows, 7, BOS, EOS, limits=jnp.asarray(limits), banned_ids=BANNED),
            rng,
            2.0,
            3,
        )
    )(jax.random.key(3))
    at_limit = 0
    for row in range(rows):
        y = hypothesis(tokens[row])
        assert y[-1] == EOS and len(y) <= limits[row] and not set(y) & set(BANNED)
        np.testing.assert_allclose(log_probs[row], log_prob(row % 4, y), rtol=1e-5)
        at_limit += len(y) == limits[row]
    assert 0 < at_limit < rows


def test_sampling_top_1_is_greedy():
    spec = SearchSpec(3, 6, BOS, EOS, limits=jnp.asarray(LIMITS), banned_ids=BANNED)
    greedy_tokens, greedy_log_probs = greedy_search(tokens_to_logits, initial_cache(3), spec)
    tokens, log_probs = sample_search(tokens_to_logits, initial_cache(3), spec, jax.random.key(5), top_k=1)
    np.testing.assert_array_equal(tokens, greedy_tokens)
    np.testing.assert_allclose(log_probs, greedy_log_probs, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1e-40, 1e-46])
def test_sampling_at_a_vanishing_temperature_is_greedy(temperature):
    """softmax(logits / t) tends to the argmax as t -> 0: a temperature that turned every tempered
    logit to -inf (1e-40), or float32's 0 (1e-46), drew pad (id 0), a banned token, at every step."""
    spec = SearchSpec(3, 6, BOS, EOS, limits=jnp.asarray(LIMITS), banned_ids=BANNED)
    greedy_tokens, greedy_log_probs = greedy_search(tokens_to_logits, initial_cache(3), spec)
    tokens, log_probs = sample_search(tokens_to_logits, initial_cache(3), spec, jax.random.key(5), temperature)
    np.testing.assert_array_equal(tokens, greedy_tokens)
    np.testing.assert_allclose(log_probs, greedy_log_probs, rtol=1e-5)


@pytest.mark.parametrize("banned", [(), BANNED])
@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.5, 0), (1.0, 2)])
def test_first_sampled_token_follows_the_tempered_distribution(temperature, top_k, banned):
    """Temperature and top-k act on the allowed tokens only."""
    rows = 20_000
    cache = {"hash": jnp.zeros((rows,), jnp.int32), "row": jnp.zeros((rows,), jnp.int32)}  # one context, many draws
    tokens, _ = jax.jit(
        lambda rng: sample_search(
            tokens_to_logits, cache, SearchSpec(rows, 1, BOS, EOS, banned_ids=banned), rng, temperature, top_k
        )
    )(jax.random.key(6))
    expected = next_log_probs(0, ()) / temperature  # the first token's, row 0
    expected[list(banned)] = -np.inf
    if top_k:
        expected[np.argsort(expected)[:-top_k]] = -np.inf
    expected = np.exp(expected - expected.max())
    expected /= expected.sum()
    observed = np.bincount(np.asarray(tokens[:, 0]), minlength=V) / rows
    np.testing.assert_allclose(observed, expected, atol=0.015)  # 4 standard errors at 20,000 draws
    assert set(np.unique(tokens[:, 0])) <= set(np.flatnonzero(expected > 0))
