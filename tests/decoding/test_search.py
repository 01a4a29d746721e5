"""The searches on a tiny random 'model', against exhaustive enumeration and plain-Python
references that score every hypothesis from the full-vocabulary log_softmax (greedy search and
sampling: test_greedy_and_sampling.py)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.beam_search import beam_search, length_penalty, top_k
from jaxformer.decoding.search import NEG_INF, CacheGrowth, SearchSpec, greedy_search

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("search")

V, PAD, EOS, BOS = 6, 0, 1, 3
BANNED = (PAD, BOS)
WORDS = (2, 4, 5)  # the tokens a hypothesis may hold before its EOS
TABLE = np.asarray(jax.random.normal(jax.random.key(0), (997, V)) * 2.0, np.float32)
LIMITS = np.array([4, 2, 3], np.int32)  # output tokens of each row, EOS included
MAX_LENGTH = 5  # the token buffers: longer than every limit


def tokens_to_logits(tokens, cache):
    """A random 'model' of the whole prefix: logits looked up by a running hash of it.

    The cache is the hash per row plus the batch row it belongs to, so rows differ."""
    prefix_hash = (cache["hash"] * 31 + tokens[:, 0] + 7 * cache["row"]) % TABLE.shape[0]
    return jnp.asarray(TABLE)[prefix_hash], {"hash": prefix_hash, "row": cache["row"]}


def initial_cache(batch):
    return {"hash": jnp.zeros((batch,), jnp.int32), "row": jnp.arange(batch, dtype=jnp.int32)}


# -- plain-Python references ---------------------------------------------------------------


def next_log_probs(row, prefix):
    """The model's log_softmax over the whole vocabulary [V] after BOS + `prefix`, float64."""
    prefix_hash = 0
    for token in (BOS, *prefix):
        prefix_hash = (prefix_hash * 31 + token + 7 * row) % TABLE.shape[0]
    logits = TABLE[prefix_hash].astype(np.float64)
    return logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


def log_prob(row, sequence):
    return sum(next_log_probs(row, sequence[:t])[token] for t, token in enumerate(sequence))


def allowed_tokens(step, limit):
    """What output token number step + 1 may be: EOS alone at the limit, else anything not banned."""
    return (EOS,) if step + 1 >= limit else tuple(t for t in range(V) if t not in BANNED)


def every_hypothesis(limit):
    return [words + (EOS,) for length in range(limit) for words in itertools.product(WORDS, repeat=length)]


def reference_beam(next_log_probs, beam, alpha, limit, stop="exact"):
    """The beam search as documented: [(score, tokens)] best first, for a model
    `next_log_probs(prefix) -> [V]`, run to the limit ("exact" stops only where nothing can
    change) or until the `stop` rule holds, checked after every step as its docstring says."""
    live, finished = [((), 0.0)], []
    for step in range(limit):
        if len(finished) == beam and stop == "beam_full":
            break
        if len(finished) == beam and stop == "current_length" and live:
            if live[0][1] / float(length_penalty(step, alpha)) <= finished[-1][0]:
                break
        candidates = sorted(
            (
                (total + next_log_probs(prefix)[token], prefix + (token,))
                for prefix, total in live
                for token in allowed_tokens(step, limit)
            ),
            key=lambda candidate: -candidate[0],
        )[: 2 * beam]
        finished += [
            (total / float(length_penalty(len(sequence), alpha)), sequence)
            for rank, (total, sequence) in enumerate(candidates)
            if sequence[-1] == EOS and rank < beam
        ]
        finished = sorted(finished, key=lambda pair: -pair[0])[:beam]
        live = [(sequence, total) for total, sequence in candidates if sequence[-1] != EOS][:beam]
    return finished


def hypothesis(tokens):
    tokens = [int(token) for token in tokens]
    return tuple(tokens[: tokens.index(EOS) + 1]) if EOS in tokens else tuple(tokens)


def run_beam(beam, alpha, limits=LIMITS, max_length=MAX_LENGTH, penalty="gnmt", stop="exact", growth=None):
    batch = len(limits)
    spec = SearchSpec(batch, max_length, BOS, EOS, limits=jnp.asarray(limits), banned_ids=BANNED, cache_growth=growth)
    return jax.jit(lambda: beam_search(tokens_to_logits, initial_cache(batch), spec, beam, alpha, penalty, stop))()


# -- beam search ---------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exhaustive_optimum(alpha):
    # Wide enough for every live hypothesis and every candidate at every step of a limit-4 row
    # (9 live beams times EOS and 3 words), narrower than its 40 hypotheses.
    beam = 36
    tokens, scores = run_beam(beam, alpha)
    for row, limit in enumerate(LIMITS):
        expected = sorted(
            ((log_prob(row, y) / float(length_penalty(len(y), alpha)), y) for y in every_hypothesis(limit)),
            key=lambda pair: -pair[0],
        )[:beam]
        returned = [hypothesis(t) for t in np.asarray(tokens[row, : len(expected)])]
        assert returned[0] == expected[0][1]
        assert sorted(returned) == sorted(y for _, y in expected)  # the top K, in some order
        np.testing.assert_allclose(scores[row, : len(expected)], [score for score, _ in expected], rtol=1e-5)
        assert (np.asarray(scores[row, len(expected) :]) < NEG_INF / 2).all()  # nothing else is possible


# slow: alpha 0.6 (3 cases, about 2 s of programs compiled); covered in the default suite by the same beams at
# alpha 0.0 (no length penalty) and 2.0 (a strong one), between which 0.6 lies.
@pytest.mark.parametrize("alpha", [0.0, pytest.param(0.6, marks=pytest.mark.slow), 2.0])
@pytest.mark.parametrize("beam", [1, 2, 3])
def test_early_stopping_changes_nothing(beam, alpha):
    """Narrow beams stop as soon as no live beam can win, long before max_length; they return
    what the same search run to every row's limit returns."""
    limits = np.array([7, 3, 6, 5], np.int32)
    tokens, scores = run_beam(beam, alpha, limits, max_length=8)
    for row, limit in enumerate(limits):
        expected = reference_beam(lambda prefix, row=row: next_log_probs(row, prefix), beam, alpha, limit)
        assert [hypothesis(t) for t in np.asarray(tokens[row, : len(expected)])] == [y for _, y in expected]
        np.testing.assert_allclose(scores[row, : len(expected)], [score for score, _ in expected], rtol=1e-5)


def step_model(probabilities):
    """A 'model' whose next-token distribution depends on the step only: `probabilities` [steps, V]."""
    logits = np.log(np.asarray(probabilities, np.float64))

    def tokens_to_logits(tokens, cache):  # the cache is the shared step index
        return jnp.broadcast_to(jnp.asarray(logits, jnp.float32)[cache], (tokens.shape[0], V)), cache + 1

    return tokens_to_logits, lambda prefix: logits[len(prefix)] - np.log(np.exp(logits[len(prefix)]).sum())


# Per step: EOS likely first (0.6), then word 4 almost certain (0.97), EOS likely again at step 9.
EOS_OR_LONG = (
    [[0.005, 0.6, 0.005, 0.005, 0.38, 0.005]]
    + [[0.005, 0.01, 0.005, 0.005, 0.97, 0.005]] * 7
    + [[0.005, 0.975, 0.005, 0.005, 0.005, 0.005]] * 2
)


def test_early_stopping_bounds_by_the_longest_reachable_length():
    """EOS is likely first (0.6); afterwards word 4 is almost certain up to the limit, 9 tokens,
    where EOS is. At alpha 2 the long hypothesis wins (-1.2 / 5.4 against -0.5 / 1.4): a bound
    using the length of the next step instead of the limit would stop after the first step."""
    tokens_to_logits, log_probs = step_model(EOS_OR_LONG)
    tokens, scores = jax.jit(
        lambda: beam_search(
            tokens_to_logits,
            jnp.int32(0),
            SearchSpec(1, 10, BOS, EOS, limits=jnp.array([9]), banned_ids=BANNED),
            1,
            2.0,
        )
    )()
    ((expected_score, expected),) = reference_beam(log_probs, 1, 2.0, 9)
    assert expected == (4,) * 8 + (EOS,)
    assert hypothesis(tokens[0, 0]) == expected
    np.testing.assert_allclose(scores[0, 0], expected_score, rtol=1e-5)


def test_early_stopping_uses_the_row_limit():
    """With a limit of 3 tokens, the live beam (-0.97 after one step) can reach at best
    -0.97 / ((5 + 3) / 6)^2 = -0.54 < -0.51 / ((5 + 1) / 6)^2, the ended (EOS,): the search stops
    after one step (bounding by max_length = 10 would run to the limit)."""
    calls = []
    tokens_to_logits, _ = step_model(EOS_OR_LONG)

    def counted(tokens, cache):
        jax.debug.callback(lambda: calls.append(1))
        return tokens_to_logits(tokens, cache)

    tokens, scores = jax.jit(
        lambda: beam_search(
            counted, jnp.int32(0), SearchSpec(1, 10, BOS, EOS, limits=jnp.array([3]), banned_ids=BANNED), 1, 2.0
        )
    )()
    assert hypothesis(tokens[0, 0]) == (EOS,)
    assert len(calls) == 1


def test_search_stops_at_the_row_limits():
    """Rows whose limits are far below max_length end the loop at the longest limit, also when a
    row has fewer possible hypotheses than beams (limit 1: EOS alone)."""
    calls = []

    def counted(tokens, cache):
        jax.debug.callback(lambda: calls.append(1))
        return tokens_to_logits(tokens, cache)

    spec = SearchSpec(3, 20, BOS, EOS, limits=jnp.array([3, 1, 3]), banned_ids=BANNED)
    for search in (
        lambda: beam_search(counted, initial_cache(3), spec, 4, 0.6),
        lambda: greedy_search(counted, initial_cache(3), spec),
    ):
        calls.clear()
        jax.block_until_ready(jax.jit(search)())
        assert 1 <= len(calls) <= 3


def test_beam_search_without_limits_cuts_at_max_length():
    """Without limits, a sequence reaching max_length is cut there as it stands (no EOS)."""
    length, beam = 3, V**3
    tokens, scores = jax.jit(
        lambda: beam_search(tokens_to_logits, initial_cache(2), SearchSpec(2, length, BOS, EOS), beam, 0.6)
    )()
    for row in range(2):
        sequences = [
            (EOS,),
            *((t, EOS) for t in range(V) if t != EOS),
            *itertools.product([t for t in range(V) if t != EOS], [t for t in range(V) if t != EOS], range(V)),
        ]
        best = max(sequences, key=lambda y: log_prob(row, y) / float(length_penalty(len(y), 0.6)))
        assert hypothesis(tokens[row, 0]) == best
        np.testing.assert_allclose(
            scores[row, 0], log_prob(row, best) / float(length_penalty(len(best), 0.6)), rtol=1e-5
        )


def test_beam_of_one_is_greedy():
    greedy_tokens, greedy_log_probs = jax.jit(
        lambda: greedy_search(
            tokens_to_logits,
            initial_cache(3),
            SearchSpec(3, MAX_LENGTH, BOS, EOS, limits=jnp.asarray(LIMITS), banned_ids=BANNED),
        )
    )()
    beam_tokens, beam_scores = run_beam(1, 0.0)
    np.testing.assert_array_equal(beam_tokens[:, 0], greedy_tokens)
    np.testing.assert_allclose(beam_scores[:, 0], greedy_log_probs, rtol=1e-5)


def test_banning_eos_is_an_error():
    with pytest.raises(ValueError, match="eos_id"):
        greedy_search(tokens_to_logits, initial_cache(1), SearchSpec(1, 3, BOS, EOS, banned_ids=(EOS,)))


def test_length_penalty_forms():
    np.testing.assert_allclose(length_penalty(7, 0.6), ((5 + 7) / 6) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.6, "gnmt"), ((5 + 7) / 6) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.6, "transformers"), 7**0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(np.array([1, 3]), 1.0, "transformers"), [1.0, 3.0])
    with pytest.raises(ValueError, match="length penalty"):
        length_penalty(3, 0.6, "marian")


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_wide_beam_with_the_transformers_length_penalty_finds_the_exhaustive_optimum(alpha):
    beam = 36
    tokens, scores = run_beam(beam, alpha, penalty="transformers")
    for row, limit in enumerate(LIMITS):
        expected = sorted(
            (
                (log_prob(row, y) / float(length_penalty(len(y), alpha, "transformers")), y)
                for y in every_hypothesis(limit)
            ),
            key=lambda pair: -pair[0],
        )[:beam]
        assert hypothesis(np.asarray(tokens[row, 0])) == expected[0][1]
        np.testing.assert_allclose(scores[row, : len(expected)], [score for score, _ in expected], rtol=1e-5)


@pytest.mark.parametrize("count", [5, 300, 4099, 32000])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_chunked_top_k_is_lax_top_k(count, k):
    """Values and indices equal jax.lax.top_k's, ties to the lower index included: rows of
    distinct values, rows with many exact ties (NEG_INF after constraints, a few repeated
    values spread over chunks) and rows whose top values share one chunk."""
    k = min(k, count)
    rng = np.random.default_rng(count * 10 + k)
    distinct = rng.standard_normal((3, count)).astype(np.float32)
    tied = rng.choice(np.float32([-2.0, -1.0, -0.5, NEG_INF]), size=(3, count))
    one_chunk = np.full((2, count), NEG_INF, np.float32)
    one_chunk[:, : min(count, 9)] = -np.arange(min(count, 9), dtype=np.float32)
    values = jnp.asarray(np.concatenate([distinct, tied, one_chunk]))
    expected_values, expected_indices = jax.lax.top_k(values, k)
    got_values, got_indices = jax.jit(top_k, static_argnums=(1,))(values, k)
    np.testing.assert_array_equal(got_indices, expected_indices)
    np.testing.assert_array_equal(got_values, expected_values)


# slow: alpha 0.6 (6 cases, about 4 s of programs compiled); covered in the default suite by the same beams and
# stop rules at alpha 0.0 (no length penalty) and 2.0 (a strong one), between which 0.6 lies.
@pytest.mark.parametrize("stop", ["current_length", "beam_full"])
@pytest.mark.parametrize("alpha", [0.0, pytest.param(0.6, marks=pytest.mark.slow), 2.0])
@pytest.mark.parametrize("beam", [1, 2, 3])
def test_stop_rules_match_the_reference_row_by_row(stop, alpha, beam):
    """Each row returns what the reference search with the same stop rule returns for that row
    alone: once a row is done nothing joins its ended hypotheses, however long the other rows
    of the batch run."""
    limits = np.array([7, 3, 6, 5, 8], np.int32)
    tokens, scores = run_beam(beam, alpha, limits, max_length=8, stop=stop)
    changed = 0
    for row, limit in enumerate(limits):
        next_row = lambda prefix, row=row: next_log_probs(row, prefix)  # noqa: E731
        expected = reference_beam(next_row, beam, alpha, limit, stop)
        assert [hypothesis(t) for t in np.asarray(tokens[row, : len(expected)])] == [y for _, y in expected]
        np.testing.assert_allclose(scores[row, : len(expected)], [score for score, _ in expected], rtol=1e-5)
        changed += expected != reference_beam(next_row, beam, alpha, limit)
    if beam == 3 and stop == "beam_full":
        assert changed  # the rule is not the exact search in disguise


def test_beam_full_stops_at_the_first_ending():
    """Where the exact search finds the long hypothesis (test above), a beam of one that stops
    once its beam is full returns the first ending, (EOS,), after one step."""
    tokens_to_logits, log_probs = step_model(EOS_OR_LONG)
    spec = SearchSpec(1, 10, BOS, EOS, limits=jnp.array([9]), banned_ids=BANNED)
    tokens, scores = jax.jit(lambda: beam_search(tokens_to_logits, jnp.int32(0), spec, 1, 2.0, stop="beam_full"))()
    assert hypothesis(tokens[0, 0]) == (EOS,)
    np.testing.assert_allclose(scores[0, 0], log_probs(())[EOS] / float(length_penalty(1, 2.0)), rtol=1e-5)


def test_unknown_stop_rule():
    with pytest.raises(ValueError, match="unknown beam stop rule 'never'"):
        run_beam(2, 0.6, stop="never")


def growing_model(lengths_seen):
    """tokens_to_logits over a cache with a real length: a history buffer [R, length] whose
    size the model reads (it fails past the end), recording every length it is called with."""

    def model(tokens, cache):
        history = cache["history"]
        jax.debug.callback(lambda length=history.shape[1]: lengths_seen.add(length))
        history = jax.lax.dynamic_update_slice_in_dim(history, tokens, cache["step"], axis=1)
        logits, inner = tokens_to_logits(tokens, cache["inner"])
        return logits, {"history": history, "step": cache["step"] + 1, "inner": inner}

    def grow(cache, length):
        return {**cache, "history": jnp.pad(cache["history"], ((0, 0), (0, length - cache["history"].shape[1])))}

    return model, grow


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_a_growing_cache_changes_no_result(method):
    """A cache that starts with 2 positions and grows to 4 and then to max_length 9 gives the
    results of a full-length cache; the search reads the cache at every length, and the grown
    cache keeps what it held (the history the model writes is checked against the tokens)."""
    limits = np.array([9, 3, 7, 9], np.int32)
    lengths_seen = set()
    model, grow = growing_model(lengths_seen)
    results = {}
    for growth in (None, CacheGrowth((2, 4), grow)):
        length = 9 if growth is None else 2
        cache = {
            "history": jnp.zeros((4, length), jnp.int32),
            "step": jnp.int32(0),
            "inner": initial_cache(4),
        }
        spec = SearchSpec(4, 9, BOS, EOS, limits=jnp.asarray(limits), banned_ids=BANNED, cache_growth=growth)
        if method == "beam":
            search = lambda spec=spec, cache=cache: beam_search(model, cache, spec, 3, 0.6)  # noqa: E731
        else:
            search = lambda spec=spec, cache=cache: greedy_search(model, cache, spec)  # noqa: E731
        results[growth is None] = jax.device_get(jax.jit(search)())
    assert lengths_seen == {2, 4, 9}
    np.testing.assert_array_equal(results[True][0], results[False][0])
    np.testing.assert_array_equal(results[True][1], results[False][1])


def test_doubling_cache_lengths():
    grow = lambda cache, length: cache  # noqa: E731
    assert CacheGrowth.doubling(32, 98, grow).lengths == (32,)
    assert CacheGrowth.doubling(32, 64, grow).lengths == (32,)
    assert CacheGrowth.doubling(32, 306, grow).lengths == (32, 64, 128)
    assert CacheGrowth.doubling(32, 63, grow) is None
    with pytest.raises(ValueError, match="cache lengths must increase"):
        SearchSpec(1, 8, BOS, EOS, cache_growth=CacheGrowth((4, 8), grow))
