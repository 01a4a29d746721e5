"""What a decoder-only model's prompt may hold: a text's ids without EOS, as LanguageModel encodes
text. Checked before anything is compiled, by LanguageModel.continue_ids and, on concrete arrays,
continue_prompts; and the sampling seed LanguageModel takes, checked before anything is read."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.language_model import (
    LanguageModel,
    check_prompt_rows,
    checked_prompts,
    continue_prompts,
)
from jaxformer.model.config import preset
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tests.conftest import assert_option_refused, assert_seed_refused, read_raw

SETTINGS = DecodeSettings(method="greedy", max_extra_length=3)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=300)


@pytest.fixture(scope="module")
def language_model(tokenizer):
    config = preset("tiny", architecture="decoder_only", vocab_size=tokenizer.vocab_size, num_decoder_layers=1)
    # Random parameters of the model's shapes, without compiling its initialisation (seconds).
    shapes = nn.meta.unbox(jax.eval_shape(DecoderOnly(config).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda leaf: rng.normal(0.0, 0.1, leaf.shape).astype(leaf.dtype), shapes["params"])
    return LanguageModel(config, params, tokenizer, SETTINGS)


def not_compiled(*_):
    raise AssertionError("the search was run: the prompt should have been refused before it")


REFUSED = [
    ([5, 6, EOS_ID], r"^prompt 1 has EOS \(1\) at position 2: a prompt is the start of a text"),
    ([5, EOS_ID, 6], r"^prompt 1 has EOS \(1\) at position 1: "),
    ([EOS_ID], r"^prompt 1 has EOS \(1\) at position 0: "),
    ([BOS_ID, 5], r"^prompt 1 has BOS \(3\) at position 0: "),
    ([5, 6, PAD_ID, PAD_ID], r"^prompt 1 has PAD \(0\) at position 2: "),
    ([5, 300], r"^prompt 1: id 300 at position 1 is outside the model's vocabulary \[0, 300\)$"),
    ([-1], r"^prompt 1: id -1 at position 0 is outside the model's vocabulary \[0, 300\)$"),
    ([[5, 6]], r"^prompt 1 must be one prompt's ids \(1-D\), got shape \(1, 2\)$"),
]


@pytest.mark.parametrize(
    "prompt,message", REFUSED, ids=["eos-end", "eos-inside", "eos-alone", "bos", "pad", "vocab", "negative", "2d"]
)
def test_continue_ids_refuses_a_prompt_that_is_not_the_start_of_a_text(language_model, monkeypatch, prompt, message):
    monkeypatch.setattr(language_model, "_continue", not_compiled)
    with pytest.raises(ValueError, match=message):
        language_model.continue_ids([np.array([7, 8]), np.array(prompt)])  # when called, not when iterated
    with pytest.raises(TypeError, match=r"^prompt 0's ids must be integers, got dtype float64$"):
        language_model.continue_ids([np.array([7.0])])
    with pytest.raises(TypeError, match="not one of shape"):
        language_model.continue_ids(np.array([7, 8]))


def test_continue_prompts_refuses_concrete_rows_holding_eos(language_model):
    model = DecoderOnly(language_model.config)
    rows = np.array([[5, 6, 7], [8, EOS_ID, 9]], np.int32)
    for given in (rows, jnp.asarray(rows)):
        with pytest.raises(ValueError, match=r"^prompt row 1 has EOS \(1\) at position 1: "):
            continue_prompts(model, language_model.params, given, SETTINGS)
    with pytest.raises(ValueError, match=r"^prompts must be ids \[batch, length\], got shape \(3,\)$"):
        check_prompt_rows(rows[0], language_model.config.vocab_size)  # continue_prompts' own check, unannotated


def test_text_prompts_and_the_empty_prompt_are_accepted(language_model, tokenizer):
    """LanguageModel encodes a text without EOS, and no text encodes to EOS, BOS or PAD (control
    pieces), written out or not; whitespace alone encodes to no id: unconditional generation."""
    texts = ["", " ", "\u200b", "Ein Mann", "Ein Mann </s> mit <s> und <pad>", *read_raw("val.de.gz", 200)]
    encoded = [tokenizer.encode(text, add_eos=False) for text in texts]
    assert all(UNK_ID in ids for ids in encoded[4:5]) and encoded[0].size == 0
    assert [ids.tolist() for ids in checked_prompts(encoded, tokenizer.vocab_size)] == [ids.tolist() for ids in encoded]
    assert checked_prompts([[]], tokenizer.vocab_size)[0].dtype == np.int32  # [] is a prompt of no ids
    continued = {}
    for indices, tokens, _ in language_model.continue_ids([np.zeros(0, np.int32), [5, 6]]):
        continued.update({index: tokens[row, 0] for row, index in enumerate(indices)})
    assert sorted(continued) == [0, 1] and all(np.all(tokens != BOS_ID) for tokens in continued.values())


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_size_below_1_is_refused_before_anything_is_read(language_model, tmp_path, batch_size):
    """As Translator refuses it: at 0 range() failed at the first prompt, below 0 no prompt was
    continued (complete_nbest gave None for each prompt, complete a TypeError); from_workdir read the
    checkpoint first."""
    parts = (language_model.config, language_model.params, language_model.tokenizer, SETTINGS)
    message = f"batch_size must be an integer >= 1, got {batch_size}"
    assert_option_refused(LanguageModel, parts, {"batch_size": batch_size}, message, tmp_path / "no run")


def test_a_seed_that_jax_would_take_for_another_is_refused_before_anything_is_read(language_model, tmp_path):
    parts = (language_model.config, language_model.params, language_model.tokenizer, SETTINGS)
    assert LanguageModel(*parts, seed=2**32 - 1).settings == SETTINGS
    for seed in (2**32, -1):  # jax.random.key would take them for 0 and 2**32 - 1
        assert_seed_refused(LanguageModel, parts, seed, tmp_path / "no run")
