"""SearchSpec.first_banned, the tokens a row's first output token may not be (EOS excepted: every
sequence can end), in greedy search, sampling and beam search, against test_search.py's tiny
random 'model' and its plain-Python references (full-vocabulary log_softmax scores: nothing is
renormalised over the tokens a ban leaves)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.beam_search import beam_search, length_penalty
from jaxformer.decoding.search import NEG_INF, SearchSpec, greedy_search, sample_search
from tests.decoding.test_search import (
    BANNED,
    BOS,
    EOS,
    LIMITS,
    MAX_LENGTH,
    WORDS,
    V,
    allowed_tokens,
    every_hypothesis,
    hypothesis,
    initial_cache,
    log_prob,
    next_log_probs,
    tokens_to_logits,
)

pytestmark = pytest.mark.xdist_group("search")


def first_bans():
    """[3, V]: row 0 may not start with the word it starts with unbanned, row 1 may start with
    anything, row 2 with nothing but EOS (banned too, which leaves it allowed)."""
    banned = np.zeros((3, V), bool)
    banned[0, max(WORDS, key=lambda token: next_log_probs(0, ())[token])] = True
    banned[2, [*WORDS, EOS]] = True
    return banned


FIRST_BANNED = first_bans()


def spec(first_banned=FIRST_BANNED):
    return SearchSpec(3, MAX_LENGTH, BOS, EOS, limits=jnp.asarray(LIMITS), banned_ids=BANNED, first_banned=first_banned)


def starts_allowed(row, sequence):
    return sequence[0] == EOS or not FIRST_BANNED[row, sequence[0]]


def test_greedy_takes_the_best_allowed_first_token_and_scores_it_unrenormalised():
    tokens, log_probs = jax.jit(lambda: greedy_search(tokens_to_logits, initial_cache(3), spec()))()
    unbanned, _ = greedy_search(tokens_to_logits, initial_cache(3), spec(None))
    for row, limit in enumerate(LIMITS):
        expected = ()
        while not expected or expected[-1] != EOS:
            allowed = [t for t in allowed_tokens(len(expected), limit) if starts_allowed(row, (*expected, t))]
            expected += (max(allowed, key=lambda token, prefix=expected: next_log_probs(row, prefix)[token]),)
        assert hypothesis(tokens[row]) == expected
        np.testing.assert_allclose(log_probs[row], log_prob(row, expected), rtol=1e-5)
    assert hypothesis(tokens[2]) == (EOS,)
    assert int(unbanned[0, 0]) != int(tokens[0, 0])  # the ban changed row 0's start
    np.testing.assert_array_equal(unbanned[1], tokens[1])  # a row with no ban is searched as before


def test_a_wide_beam_finds_the_exhaustive_optimum_among_the_allowed_starts():
    beam, alpha = 36, 0.6
    tokens, scores = jax.jit(lambda: beam_search(tokens_to_logits, initial_cache(3), spec(), beam, alpha))()
    for row, limit in enumerate(LIMITS):
        expected = sorted(
            (
                (log_prob(row, y) / float(length_penalty(len(y), alpha)), y)
                for y in every_hypothesis(limit)
                if starts_allowed(row, y)
            ),
            key=lambda pair: -pair[0],
        )[:beam]
        returned = [hypothesis(t) for t in np.asarray(tokens[row, : len(expected)])]
        assert sorted(returned) == sorted(y for _, y in expected)
        np.testing.assert_allclose(scores[row, : len(expected)], [score for score, _ in expected], rtol=1e-5)
        assert (np.asarray(scores[row, len(expected) :]) < NEG_INF / 2).all()  # nothing else is possible


def test_sampling_never_draws_a_banned_first_token():
    rows = 60
    cache = {"hash": jnp.zeros((rows,), jnp.int32), "row": jnp.arange(rows, dtype=jnp.int32) % 3}
    banned = np.tile(FIRST_BANNED, (rows // 3, 1))
    limits = jnp.asarray(np.tile(LIMITS, rows // 3))
    sampled_spec = SearchSpec(rows, MAX_LENGTH, BOS, EOS, limits=limits, banned_ids=BANNED, first_banned=banned)
    tokens, log_probs = jax.jit(lambda rng: sample_search(tokens_to_logits, cache, sampled_spec, rng, 2.0))(
        jax.random.key(3)
    )
    firsts = np.asarray(tokens[:, 0])
    assert len(set(firsts[1::3].tolist())) > 1  # the unbanned row is drawn from, not fixed
    for row in range(rows):
        y = hypothesis(tokens[row])
        assert starts_allowed(row % 3, y)
        np.testing.assert_allclose(log_probs[row], log_prob(row % 3, y), rtol=1e-5)


def test_bans_of_another_row_count_are_refused():
    with pytest.raises(ValueError, match=r"^first_banned must be \[3, vocabulary\], one row per row; got \(2, 6\)$"):
        SearchSpec(3, MAX_LENGTH, BOS, EOS, first_banned=np.zeros((2, V), bool))
