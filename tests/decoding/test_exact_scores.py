"""Every score `generate` returns is the model's own, as the full forward pass computes it.

For a hypothesis Y (output tokens up to and including EOS) of source X, the full forward pass
`Transformer.__call__(X, BOS + Y[:-1])` gives log p(Y) = sum_t log_softmax(logits_t)[Y_t].
Beam search must return log p(Y) / ((5 + |Y|) / 6)^alpha, greedy search and sampling log p(Y),
also for hypotheses that reach their row's length limit (where only EOS is allowed, at its real
cost), and no search may emit pad or BOS. With DecodeSettings(renormalize_after_bans=True),
log p(Y) is the full pass's with each position's softmax taken over the tokens the search allows
there (not pad or BOS; EOS alone at the row's limit, where it then costs 0).
"""

import dataclasses
import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.beam_search import length_penalty
from jaxformer.decoding.generate import DecodeSettings, make_generate_fn
from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("exact-scores")

# Six tokens: pad, EOS, unk, BOS and two words. The search may emit EOS, unk and the words.
SMALL = preset("tiny", vocab_size=6, deterministic=True)
WORDS = (2, 4, 5)  # every token a hypothesis may hold before its EOS
# Limits 4, 3, 2, 4 (source tokens + 1). With the parameters of `small_params`, the best
# hypotheses of rows 0 and 2 end at their limit, those of rows 1 and 3 before it (at alpha 0;
# at alpha 0.6, the length penalty's favour for longer outputs moves row 3's to its limit).
SMALL_SOURCES = np.array([[4, 5, EOS_ID], [5, EOS_ID, PAD_ID], [EOS_ID, PAD_ID, PAD_ID], [5, 5, EOS_ID]], np.int32)
SMALL_EXTRA = 1

LARGE = preset("tiny", vocab_size=64, deterministic=True)
LARGE_EXTRA = 3
TOLERANCE = dict(atol=1e-4, rtol=1e-5)  # float32 sums of up to ~100 nats


def random_params(config, seed, scale):
    """A random model, its parameters times `scale` (sharper, far from uniform distributions)."""
    variables = Transformer(config).init(jax.random.key(seed), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    return jax.tree.map(lambda leaf: leaf * scale, nn.meta.unbox(variables["params"]))


@functools.cache
def forward(config):
    """The full forward pass: logits [N, T, V] of decoder inputs [N, T] given sources [N, S]."""
    model = Transformer(config)
    return jax.jit(lambda params, source, target: model.apply({"params": params}, source, target, deterministic=True))


@functools.cache
def generate_fn(config, settings):
    return make_generate_fn(config, settings)


def hypothesis(tokens):
    """The tokens up to and including the first EOS (all of them if there is none)."""
    tokens = [int(token) for token in tokens]
    return tuple(tokens[: tokens.index(EOS_ID) + 1]) if EOS_ID in tokens else tuple(tokens)


def log_probs_by_full_pass(config, params, sources, hypotheses, length, limits=None):
    """log p(Y) [N] of each hypothesis Y (a tuple of at most `length` ids ending in EOS) of
    source row `sources[n]`; given `limits` [N] (each hypothesis's row limit), with each
    position's softmax over the tokens allowed there (renormalize_after_bans)."""
    rows = -(-len(hypotheses) // 16) * 16  # few shapes, few compilations
    targets = np.zeros((rows, length), np.int32)
    inputs = np.zeros((rows, length), np.int32)  # BOS + Y[:-1], then padding
    inputs[:, 0] = BOS_ID
    source = np.repeat(sources[:1], rows, axis=0)
    for n, y in enumerate(hypotheses):
        targets[n, : len(y)] = y
        inputs[n, 1 : len(y)] = y[:-1]
        source[n] = sources[n]
    logits = forward(config)(params, jnp.asarray(source), jnp.asarray(inputs))  # [rows, length, V]
    if limits is None:
        log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    else:
        log_probs = allowed_log_softmax(np.asarray(logits, np.float64), np.resize(limits, rows))
    picked = np.take_along_axis(log_probs, targets[:, :, None], axis=-1)[:, :, 0]  # [rows, length]
    return np.asarray([picked[n, : len(y)].sum() for n, y in enumerate(hypotheses)])


def allowed_log_softmax(logits, limits):
    """log_softmax of `logits` [N, T, V] over the tokens allowed at each position: neither pad nor
    BOS, and EOS alone where the output token reaches its row's limit (`limits` [N])."""
    allowed = np.ones(logits.shape, bool)
    allowed[..., [PAD_ID, BOS_ID]] = False
    at_limit = np.arange(logits.shape[1])[None, :] + 1 >= np.asarray(limits)[:, None]  # [N, T]
    allowed[at_limit] = np.arange(logits.shape[-1]) == EOS_ID
    logits = np.where(allowed, logits, -np.inf)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def documented_score(log_prob, length, alpha):
    return log_prob / float(length_penalty(length, alpha))


def limits_of(sources, extra):
    return (np.asarray(sources) != PAD_ID).sum(axis=1) + extra


# -- (a) an exhaustive beam finds what enumerating every hypothesis finds --------------------


def every_hypothesis(limit):
    """Every sequence of WORDS ended by EOS within `limit` tokens (so EOS is the limit-th token
    of those that reach it)."""
    return [words + (EOS_ID,) for length in range(limit) for words in itertools.product(WORDS, repeat=length)]


@pytest.fixture(scope="module")
def small_params():
    return random_params(SMALL, seed=1, scale=2.0)


@pytest.fixture(scope="module")
def enumeration(small_params):
    """Per renormalize_after_bans (False, True), per source row, every hypothesis with its log p(Y)
    by the full forward pass."""
    limits = limits_of(SMALL_SOURCES, SMALL_EXTRA)
    per_row = [every_hypothesis(limit) for limit in limits]
    sources = np.concatenate(
        [np.repeat(SMALL_SOURCES[row : row + 1], len(ys), axis=0) for row, ys in enumerate(per_row)]
    )
    hypotheses = [y for ys in per_row for y in ys]
    hypothesis_limits = np.repeat(limits, [len(ys) for ys in per_row])
    split = np.cumsum([len(ys) for ys in per_row])[:-1]
    enumerated = {}
    for renormalized in (False, True):
        log_probs = log_probs_by_full_pass(
            SMALL, small_params, sources, hypotheses, length=4, limits=hypothesis_limits if renormalized else None
        )
        enumerated[renormalized] = [
            dict(zip(ys, row_log_probs)) for ys, row_log_probs in zip(per_row, np.split(log_probs, split))
        ]
    return enumerated


@pytest.mark.parametrize(("alpha", "renormalize"), [(0.0, False), (0.6, False), (0.6, True)])
def test_exhaustive_beam_equals_enumeration(small_params, enumeration, alpha, renormalize):
    limits = limits_of(SMALL_SOURCES, SMALL_EXTRA)
    # The widest step of the longest row: 3^(limit - 2) live hypotheses, each with EOS and the
    # 3 words as candidates. A beam this wide keeps every live hypothesis and ranks every
    # ended one among its best K; it is still narrower than the 40 hypotheses of a limit-4 row,
    # so the n-best list is a real top K.
    beam = len(WORDS) ** (limits.max() - 2) * (len(WORDS) + 1)
    assert beam < len(every_hypothesis(limits.max()))
    settings = DecodeSettings(
        beam_size=int(beam), alpha=alpha, max_extra_length=SMALL_EXTRA, renormalize_after_bans=renormalize
    )
    tokens, scores = generate_fn(SMALL, settings)(small_params, jnp.asarray(SMALL_SOURCES))
    tokens, scores = np.asarray(tokens), np.asarray(scores)

    best_at_limit = []
    for row, log_probs in enumerate(enumeration[renormalize]):
        expected = sorted(
            ((documented_score(lp, len(y), alpha), y) for y, lp in log_probs.items()), key=lambda pair: -pair[0]
        )
        kept = min(beam, len(expected))
        returned = [hypothesis(t) for t in tokens[row, :kept]]
        print(
            f"alpha {alpha} row {row} (limit {limits[row]}): best {returned[0]} {scores[row, 0]:.5f}, "
            f"enumeration {expected[0][1]} {expected[0][0]:.5f}, runner-up {expected[1][0]:.5f}"
        )
        # The best hypothesis, and the whole n-best list: the top K of the enumeration, best
        # first, each scored exactly as the enumeration scores it.
        assert expected[0][0] - expected[1][0] > 1e-3  # no tie: the best sequence is well defined
        assert returned[0] == expected[0][1]
        np.testing.assert_allclose(scores[row, :kept], [score for score, _ in expected[:kept]], **TOLERANCE)
        assert len(set(returned)) == kept
        for y, score in zip(returned, scores[row, :kept]):
            np.testing.assert_allclose(score, documented_score(log_probs[y], len(y), alpha), **TOLERANCE)
        assert (scores[row, kept:] < -1e8).all()  # slots beyond the possible hypotheses stay empty
        best_at_limit.append(len(expected[0][1]) == limits[row])
    if not renormalize:  # the case the free EOS at the limit got wrong is exercised, and so is the other
        assert any(best_at_limit) and not all(best_at_limit), best_at_limit
    else:  # renormalised, EOS at the limit costs 0 and most bests end there; some differ from the model's
        model_best = [
            max(row, key=lambda y, row=row: documented_score(row[y], len(y), alpha)) for row in enumeration[False]
        ]
        assert [hypothesis(t) for t in tokens[:, 0]] != model_best


# -- (b), (c): n-best, greedy and sampled scores on a larger vocabulary ----------------------


@pytest.fixture(scope="module")
def large_params():
    return random_params(LARGE, seed=0, scale=1.0)


@pytest.fixture(scope="module")
def large_sources():
    """Rows of 2 to 7 real tokens (limits 5 to 10), each ending in EOS."""
    lengths = np.array([7, 2, 5, 3])
    words = np.asarray(jax.random.randint(jax.random.key(1), (4, 7), 4, LARGE.vocab_size), np.int32)
    positions = np.arange(7)[None, :]
    source = np.where(positions < lengths[:, None] - 1, words, PAD_ID)
    source[np.arange(4), lengths - 1] = EOS_ID
    return source


def check_hypotheses(config, params, sources, extra, tokens, scores, alpha=None, renormalized=False):
    """Every hypothesis ends in EOS within its row's limit, holds no pad or BOS, and scores what
    the full forward pass gives (`renormalized`: over the tokens allowed at each position); returns
    how many end exactly at the limit."""
    tokens, scores = np.asarray(tokens), np.asarray(scores)  # [B, K, L], [B, K]
    limits = limits_of(sources, extra)
    hypotheses, rows = [], []
    for row in range(tokens.shape[0]):
        for k in range(tokens.shape[1]):
            y = hypothesis(tokens[row, k])
            assert y[-1] == EOS_ID and len(y) <= limits[row], (row, k, y)
            assert PAD_ID not in y and BOS_ID not in y, (row, k, y)
            assert (tokens[row, k, len(y) :] == PAD_ID).all()
            hypotheses.append(y)
            rows.append(row)
    hypothesis_limits = limits[rows] if renormalized else None
    log_probs = log_probs_by_full_pass(config, params, sources[rows], hypotheses, tokens.shape[-1], hypothesis_limits)
    lengths = np.asarray([len(y) for y in hypotheses])
    expected = log_probs if alpha is None else log_probs / np.asarray(length_penalty(lengths, alpha))
    np.testing.assert_allclose(scores.reshape(-1), expected, **TOLERANCE)
    return int((lengths == limits[rows]).sum())


def test_beam_nbest_scores_are_exact(large_params, large_sources):
    settings = DecodeSettings(beam_size=4, alpha=0.6, max_extra_length=LARGE_EXTRA)
    tokens, scores = generate_fn(LARGE, settings)(large_params, jnp.asarray(large_sources))
    assert tokens.shape == (4, 4, 7 + LARGE_EXTRA)
    at_limit = check_hypotheses(LARGE, large_params, large_sources, LARGE_EXTRA, tokens, scores, alpha=0.6)
    print(f"beam 4: {at_limit} of 16 hypotheses end at their row's limit")
    assert 0 < at_limit < 16
    assert (np.diff(np.asarray(scores), axis=1) <= 1e-6).all()  # best first


@pytest.mark.parametrize(
    "settings",
    [
        DecodeSettings(method="greedy", max_extra_length=LARGE_EXTRA),
        DecodeSettings(method="sample", temperature=1.5, top_k=20, max_extra_length=LARGE_EXTRA),
    ],
    ids=["greedy", "sample"],
)
def test_greedy_and_sampled_scores_are_exact(large_params, large_sources, settings):
    at_limit = 0
    for seed in range(3 if settings.method == "sample" else 1):
        tokens, scores = generate_fn(LARGE, settings)(large_params, jnp.asarray(large_sources), jax.random.key(seed))
        assert tokens.shape == (4, 1, 7 + LARGE_EXTRA)
        at_limit += check_hypotheses(LARGE, large_params, large_sources, LARGE_EXTRA, tokens, scores)
    print(f"{settings.method}: {at_limit} rows end at their limit")
    assert at_limit > 0


# -- (d) a model that prefers pad and BOS still never emits them -----------------------------


@pytest.fixture(scope="module")
def pad_loving_params(large_params):
    """The large model with pad's and BOS's output embeddings aligned with a direction every
    final decoder state carries (the last LayerNorm's bias): most of the mass is theirs."""
    direction = np.array(jax.random.normal(jax.random.key(7), (LARGE.d_model,)))
    direction /= np.linalg.norm(direction)
    params = jax.tree.map(np.array, large_params)  # writable host copies
    params["decoder"]["layer_1"]["feed_forward_norm"]["bias"] += 4.0 * direction
    params["shared_embedding"]["embedding"][[PAD_ID, BOS_ID]] = 2.0 * direction
    return params


PAD_LOVING_SETTINGS = [
    DecodeSettings(beam_size=4, alpha=0.6, max_extra_length=LARGE_EXTRA),
    DecodeSettings(method="greedy", max_extra_length=LARGE_EXTRA),
    DecodeSettings(method="sample", temperature=1.5, top_k=20, max_extra_length=LARGE_EXTRA),
]


@pytest.mark.parametrize("settings", PAD_LOVING_SETTINGS, ids=["beam", "greedy", "sample"])
def test_pad_and_bos_are_never_generated(pad_loving_params, large_sources, settings):
    inputs = np.full((16, 7 + LARGE_EXTRA), 10, np.int32)  # the shapes check_hypotheses passes
    inputs[:, 0] = BOS_ID
    sources = jnp.asarray(np.tile(large_sources, (4, 1)))
    probs = jax.nn.softmax(forward(LARGE)(pad_loving_params, sources, jnp.asarray(inputs)), axis=-1)
    special_mass = np.asarray(probs[..., PAD_ID] + probs[..., BOS_ID])  # [B, T]
    assert special_mass.mean() > 0.9, special_mass
    tokens, scores = generate_fn(LARGE, settings)(pad_loving_params, jnp.asarray(large_sources), jax.random.key(0))
    # check_hypotheses asserts no pad or BOS before EOS; the scores, not renormalised after the
    # ban, are still the model's log-probabilities.
    check_hypotheses(
        LARGE,
        pad_loving_params,
        large_sources,
        LARGE_EXTRA,
        tokens,
        scores,
        alpha=settings.alpha if settings.method == "beam" else None,
    )


@pytest.mark.parametrize("settings", PAD_LOVING_SETTINGS, ids=["beam", "greedy", "sample"])
def test_renormalized_scores_are_exact_over_the_allowed_tokens(pad_loving_params, large_sources, settings):
    """renormalize_after_bans: every score sums each step's log_softmax over the tokens allowed
    there, which for this model (pad and BOS hold most of the mass) is far above log p under the
    model; greedy search and sampling choose the tokens they choose without it."""
    renormalized = dataclasses.replace(settings, renormalize_after_bans=True)
    source, key = jnp.asarray(large_sources), jax.random.key(0)
    plain_tokens, plain_scores = generate_fn(LARGE, settings)(pad_loving_params, source, key)
    tokens, scores = generate_fn(LARGE, renormalized)(pad_loving_params, source, key)
    alpha = settings.alpha if settings.method == "beam" else None
    check_hypotheses(LARGE, pad_loving_params, large_sources, LARGE_EXTRA, tokens, scores, alpha, renormalized=True)
    # Each hypothesis scores at least its log p, so the k-th best at least the k-th best log p.
    assert (np.asarray(scores) > np.asarray(plain_scores) + 1.0).all()
    if settings.method != "beam":
        np.testing.assert_array_equal(tokens, plain_tokens)
