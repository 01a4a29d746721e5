"""BERT's masking: which tokens are selected, what replaces them, and the objective built on it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID
from jaxformer.training.mlm_masking import mask_tokens

VOCAB = 60


@pytest.fixture(scope="module")
def sample():
    """400,000 tokens: ordinary ids, specials and the mask id mixed in."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(NUM_SPECIAL_TOKENS, VOCAB, (800, 500)).astype(np.int32)
    specials = rng.random(tokens.shape) < 0.2
    tokens[specials] = rng.choice([PAD_ID, EOS_ID, UNK_ID, BOS_ID, 4], specials.sum())  # id 4: the mask piece
    masked = jax.device_get(mask_tokens(jax.random.key(1), jnp.asarray(tokens), 4, VOCAB))
    return tokens, masked


def test_selection_rate_is_15_percent_of_ordinary_tokens(sample):
    tokens, masked = sample
    ordinary = tokens >= 5
    selected = masked.weights == 1.0
    assert not selected[~ordinary].any()  # specials and the mask id itself are never selected
    rate = selected.sum() / ordinary.sum()
    assert abs(rate - 0.15) < 0.003, rate  # about 10 standard deviations of a 320,000-token sample: 0.0006
    np.testing.assert_array_equal(masked.targets, tokens)
    np.testing.assert_array_equal(masked.inputs[~selected], tokens[~selected])  # the rest untouched


def test_replacements_are_80_10_10(sample):
    tokens, masked = sample
    selected = masked.weights == 1.0
    inputs, originals = masked.inputs[selected], tokens[selected]
    to_mask = inputs == 4
    kept = inputs == originals
    randomized = ~to_mask & ~kept
    n = selected.sum()
    # A random replacement equals the original 1 time in 55: those count as kept.
    assert abs(to_mask.mean() - 0.8) < 0.01
    assert abs(kept.mean() - (0.1 + 0.1 / 55)) < 0.01
    assert abs(randomized.mean() - 0.1 * 54 / 55) < 0.01
    assert n > 40_000


def test_random_replacements_are_uniform_over_ordinary_ids(sample):
    tokens, masked = sample
    selected = masked.weights == 1.0
    replaced = masked.inputs[selected & (masked.inputs != tokens) & (masked.inputs != 4)]
    assert replaced.min() >= 5 and replaced.max() == VOCAB - 1  # never a special id, never the mask id
    counts = np.bincount(replaced, minlength=VOCAB)[5:]
    expected = len(replaced) / 55
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert chi_square < 110  # 54 degrees of freedom: p < 1e-5 above this


def test_the_mask_id_after_the_vocabulary_end_is_skipped_too():
    tokens = jnp.full((200, 200), 7, jnp.int32)
    masked = mask_tokens(jax.random.key(0), tokens, VOCAB - 1, VOCAB, rate=1.0, mask_fraction=0.0, random_fraction=1.0)
    assert int(masked.inputs.min()) >= NUM_SPECIAL_TOKENS and int(masked.inputs.max()) <= VOCAB - 2


def test_the_same_key_gives_the_same_masking_and_another_key_another():
    tokens = jnp.asarray(np.random.default_rng(2).integers(5, VOCAB, (4, 64)), jnp.int32)
    first = mask_tokens(jax.random.key(3), tokens, 4, VOCAB)
    again = mask_tokens(jax.random.key(3), tokens, 4, VOCAB)
    other = mask_tokens(jax.random.key(4), tokens, 4, VOCAB)
    np.testing.assert_array_equal(first.inputs, again.inputs)
    assert not np.array_equal(first.weights, other.weights)
