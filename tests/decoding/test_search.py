"""Greedy and beam search against exhaustive enumeration on a tiny random model."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.search import beam_search, greedy_search, length_penalty, sample_search

V, L, BOS, EOS = 5, 4, 3, 1
TABLE = np.asarray(jax.random.normal(jax.random.key(0), (997, V)) * 2.0, np.float32)


def tokens_to_logits(tokens, cache):
    """A random 'model' of the whole prefix: logits looked up by a running hash of it.

    The cache is the hash per row plus the batch row it belongs to, so rows differ."""
    prefix_hash = (cache["hash"] * 31 + tokens[:, 0] + 7 * cache["row"]) % TABLE.shape[0]
    return jnp.asarray(TABLE)[prefix_hash], {"hash": prefix_hash, "row": cache["row"]}


def initial_cache(batch):
    return {"hash": jnp.zeros((batch,), jnp.int32), "row": jnp.arange(batch, dtype=jnp.int32)}


def exhaustive_best(row, alpha):
    """(tokens, score) of the best sequence of row `row`: ended by EOS, or cut at L tokens."""
    best = (None, -np.inf)
    for length in range(1, L + 1):
        for sequence in itertools.product(range(V), repeat=length):
            if EOS in sequence[:-1] or (length < L and sequence[-1] != EOS):
                continue  # not a complete hypothesis
            cache = {"hash": jnp.zeros((1,), jnp.int32), "row": jnp.array([row], jnp.int32)}
            total, previous = 0.0, BOS
            for token in sequence:
                logits, cache = tokens_to_logits(jnp.array([[previous]]), cache)
                total += float(jax.nn.log_softmax(logits[0])[token])
                previous = token
            score = total / float(length_penalty(length, alpha))
            if score > best[1]:
                best = (sequence, score)
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exhaustive_optimum(alpha):
    beam = V**L
    tokens, scores = jax.jit(
        lambda: beam_search(tokens_to_logits, initial_cache(2), 2, beam, L, BOS, EOS, alpha)
    )()
    for row in range(2):
        best_tokens, best_score = exhaustive_best(row, alpha)
        np.testing.assert_allclose(scores[row, 0], best_score, rtol=1e-5)
        assert tuple(int(t) for t in tokens[row, 0, : len(best_tokens)]) == best_tokens
        assert (np.diff(np.asarray(scores[row])) <= 1e-6).all()  # best first


def test_beam_of_one_is_greedy():
    greedy_tokens, greedy_log_probs = jax.jit(lambda: greedy_search(tokens_to_logits, initial_cache(3), 3, 6, BOS, EOS))()
    beam_tokens, beam_scores = jax.jit(
        lambda: beam_search(tokens_to_logits, initial_cache(3), 3, 1, 6, BOS, EOS, alpha=0.0)
    )()
    np.testing.assert_array_equal(beam_tokens[:, 0], greedy_tokens)
    np.testing.assert_allclose(beam_scores[:, 0], greedy_log_probs, rtol=1e-5)


def test_greedy_pads_after_eos_and_stops():
    tokens, _ = greedy_search(tokens_to_logits, initial_cache(4), 4, 8, BOS, EOS)
    for row in np.asarray(tokens):
        if EOS in row:
            assert (row[list(row).index(EOS) + 1 :] == 0).all()


def test_sampling_top_1_is_greedy():
    greedy_tokens, greedy_log_probs = greedy_search(tokens_to_logits, initial_cache(3), 3, 6, BOS, EOS)
    tokens, log_probs = sample_search(tokens_to_logits, initial_cache(3), 3, 6, BOS, EOS, jax.random.key(5), top_k=1)
    np.testing.assert_array_equal(tokens, greedy_tokens)
    np.testing.assert_allclose(log_probs, greedy_log_probs, rtol=1e-5)


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.5, 0), (1.0, 2)])
def test_first_sampled_token_follows_the_tempered_distribution(temperature, top_k):
    rows = 20_000
    cache = {"hash": jnp.zeros((rows,), jnp.int32), "row": jnp.zeros((rows,), jnp.int32)}  # one context, many draws
    tokens, _ = jax.jit(
        lambda rng: sample_search(tokens_to_logits, cache, rows, 1, BOS, EOS, rng, temperature, top_k)
    )(jax.random.key(6))
    logits, _ = tokens_to_logits(jnp.array([[BOS]]), {"hash": jnp.zeros((1,), jnp.int32), "row": jnp.zeros((1,), jnp.int32)})
    expected = np.asarray(logits[0], np.float64) / temperature
    if top_k:
        expected[np.argsort(expected)[:-top_k]] = -np.inf
    expected = np.exp(expected - expected.max())
    expected /= expected.sum()
    observed = np.bincount(np.asarray(tokens[:, 0]), minlength=V) / rows
    np.testing.assert_allclose(observed, expected, atol=0.015)  # 4 standard errors at 20,000 draws
    if top_k:
        assert set(np.unique(tokens[:, 0])) <= set(np.flatnonzero(expected > 0))
