"""BERT's masking: which tokens are selected, what replaces them, and the objective built on it."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.data.parallel_text import DataError
from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID
from jaxformer.training.mlm_masking import mask_tokens
from jaxformer.training.objectives import MASKED_TARGETS, MASKED_WEIGHTS, MaskedLanguageModel

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


def _packed(examples, per_row, rows_per_batch, row_length=24):
    """`examples` packed `per_row` to a row (segment ids 1, 2, ...), in batches of `rows_per_batch`
    rows, the last padded with empty rows, as the evaluation pipeline lays them out."""
    rows = [examples[i : i + per_row] for i in range(0, len(examples), per_row)]
    batches = []
    for first in range(0, len(rows), rows_per_batch):
        inputs = np.zeros((rows_per_batch, row_length), np.int32)
        segments = np.zeros_like(inputs)
        for row, packed in enumerate(rows[first : first + rows_per_batch]):
            position = 0
            for segment, example in enumerate(packed, start=1):
                inputs[row, position : position + len(example)] = example
                segments[row, position : position + len(example)] = segment
                position += len(example)
        batches.append({"inputs": inputs, "inputs_segment_ids": segments})
    return batches


def _by_example(batches):
    """{example's tokens: (masked inputs, weights)} of masked evaluation batches."""
    found = {}
    for batch in batches:
        for row in range(batch["inputs"].shape[0]):
            segments = batch["inputs_segment_ids"][row]
            for segment in np.unique(segments[segments > 0]):
                span = segments == segment
                key = tuple(batch[MASKED_TARGETS][row, span])
                found[key] = (tuple(batch["inputs"][row, span]), tuple(batch[MASKED_WEIGHTS][row, span]))
    return found


def test_evaluation_masking_is_per_example_whatever_the_packing():
    """An example is masked alike packed alone in batches of 4 rows or three to a row in batches of
    3: which positions an evaluation scores cannot depend on data.eval_batch_size."""
    rng = np.random.default_rng(5)
    examples = [rng.integers(NUM_SPECIAL_TOKENS + 1, VOCAB, rng.integers(3, 8)).astype(np.int32) for _ in range(30)]
    objective = MaskedLanguageModel(mask_id=4, vocab_size=VOCAB, seed=7)
    alone = _by_example(objective.evaluation_batches(_packed(examples, per_row=1, rows_per_batch=4)))
    three = _by_example(objective.evaluation_batches(_packed(examples, per_row=3, rows_per_batch=3)))
    assert len(alone) == len(three) == len({tuple(e) for e in examples}) and alone == three
    weights = np.concatenate([np.array(w) for _, w in alone.values()])
    assert 0 < weights.sum() < len(weights)  # some positions scored, not all
    changed = [inputs != targets for targets, (inputs, _) in alone.items()]
    assert any(changed)
    other_seed = MaskedLanguageModel(mask_id=4, vocab_size=VOCAB, seed=8)
    assert _by_example(other_seed.evaluation_batches(_packed(examples, per_row=1, rows_per_batch=4))) != alone


def test_evaluation_that_masks_no_token_is_refused():
    """Validation whose masking selects nothing would score a loss of 0 and a perplexity of 1."""
    one_token = [np.array([NUM_SPECIAL_TOKENS + 1], np.int32)]
    for seed in range(100):  # a seed whose masking skips the one token (15% select it)
        objective = MaskedLanguageModel(mask_id=4, vocab_size=VOCAB, seed=seed)
        try:
            objective.evaluation_batches(_packed(one_token, per_row=1, rows_per_batch=2))
        except DataError as error:
            assert str(error) == (
                f"evaluation: the masking (seed {seed}) selects none of the 1 tokens of the 1 validation examples; "
                "evaluate more of them (data.max_eval_examples)"
            )
            break
    else:
        pytest.fail("no seed of 100 left the one token unmasked")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rate": 0.0}, "masking rate=0.0: must be in (0, 1]"),
        ({"rate": float("nan")}, "masking rate=nan: must be in (0, 1]"),
        ({"rate": -0.1}, "masking rate=-0.1: must be in (0, 1]"),
        ({"rate": 1.5}, "masking rate=1.5: must be in (0, 1]"),
        ({"mask_fraction": -1.0}, "masking mask_fraction=-1.0: must be in [0, 1]"),
        ({"random_fraction": 1.2}, "masking random_fraction=1.2: must be in [0, 1]"),
        ({"mask_fraction": 0.9, "random_fraction": 0.3}, "mask_fraction=0.9 + random_fraction=0.3 is above 1"),
        ({"mask_id": EOS_ID}, f"mask_id={EOS_ID}: must be an ordinary id of the vocabulary, from 4 to {VOCAB - 1}"),
        ({"mask_id": VOCAB}, f"mask_id={VOCAB}: must be an ordinary id of the vocabulary"),
        ({"mask_id": -1}, "mask_id=-1: must be an ordinary id of the vocabulary"),
    ],
)
def test_masking_settings_outside_their_ranges_are_refused(settings, message):
    """A rate of 0 (or NaN) selected nothing, so every loss read no position; above 1 it masked
    all as 1 does; fractions summing above 1 kept none; a special or out-of-vocabulary mask id
    went into the inputs. Each is now one line naming the setting."""
    arguments = {"mask_id": 4, "rate": 0.15, "mask_fraction": 0.8, "random_fraction": 0.1, **settings}
    tokens = jnp.full((2, 8), 7, jnp.int32)
    with pytest.raises(ValueError, match=re.escape(message)):
        mask_tokens(jax.random.key(0), tokens, arguments.pop("mask_id"), VOCAB, **arguments)


def test_a_rate_of_one_selects_every_ordinary_token():
    tokens = jnp.asarray([[7, 8, EOS_ID, PAD_ID]], jnp.int32)
    masked = mask_tokens(jax.random.key(0), tokens, 4, VOCAB, rate=1.0)
    np.testing.assert_array_equal(masked.weights, [[1.0, 1.0, 0.0, 0.0]])
