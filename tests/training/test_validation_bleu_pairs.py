"""Which validation pairs validation BLEU and the final choice score: the first N whose sides
both encode to a piece, as evaluate's --max_examples counts them."""

import dataclasses
import logging

import ml_collections
import pytest

from jaxformer.commands import evaluate
from jaxformer.data import scored_pairs
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.model.config import preset
from jaxformer.training import validation_bleu
from jaxformer.training.experiment import default_config

DATA = ml_collections.ConfigDict({"source_language": "en", "target_language": "de"})


@pytest.fixture(scope="module")
def tokenizer():
    words = "one two three four five six seven eight nine ten".split()
    return train_tokenizer(words * 3, vocab_size=20)


def _records(sources, references):
    """A prepared split's records (array_record gives bytes)."""
    return [{"en": source.encode(), "de": reference.encode()} for source, reference in zip(sources, references)]


def test_pairs_with_a_side_of_no_piece_are_not_scored_and_are_said_once(tokenizer, caplog):
    """A zero-width space or control characters alone encode to EOS alone: translate would give the
    source an empty output, and BLEU would count it; left out as evaluate leaves it out."""
    sources = ["one two", "three", "\u200b", "four"]
    references = ["eins", "\x07\x1b", "zwei", "drei"]
    records = _records(sources, references)
    with caplog.at_level(logging.WARNING):
        assert validation_bleu.scored_pairs(records, DATA, 0, (tokenizer, tokenizer)) == (
            ["one two", "four"],
            ["eins", "drei"],
        )
        assert validation_bleu.scored_pairs(records, DATA, 1, (tokenizer, tokenizer)) == (["one two"], ["eins"])
    assert caplog.messages == [
        "skipped 2 pairs with an empty side in the first 4 validation pairs scored for BLEU "
        "(first at pair 2; a side the tokenizer encodes to no piece or that shows nothing)"
    ]


@pytest.mark.parametrize("chunk", [2, 4096])
def test_the_first_n_pairs_are_those_evaluate_max_examples_scores(tokenizer, chunk, monkeypatch, caplog):
    """training.bleu_examples and data.max_eval_examples (validation BLEU, the final choice) count
    the pairs left once those of no piece are left out, as evaluate's --max_examples does, so each
    scores the same sentences: the first N pairs left, not the pairs left of the first N."""
    monkeypatch.setattr(scored_pairs, "ENCODE_CHUNK", chunk)  # read a chunk at a time, or at once
    sources = ["one two", "\u200b", "three", "four", "five", "\x07", "six", "seven"]
    references = ["eins", "zwei", "drei", "\u200b", "fuenf", "sechs", "sieben", "acht"]
    records = _records(sources, references)
    left = [index for index in range(len(sources)) if index not in (1, 3, 5)]  # the pairs with pieces
    config = default_config()
    config.data.update(DATA)
    model_config = dataclasses.replace(preset("tiny"), vocab_size=tokenizer.vocab_size)  # nothing is translated
    for count in range(1, len(sources) + 2):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            scored = validation_bleu.ValidationSet(config, model_config, tokenizer, records, count)
        validation = (scored.sources, scored.references)
        pairs = [(number, source, reference) for number, (source, reference) in enumerate(zip(sources, references), 1)]
        evaluated = evaluate._first_scored("validation", pairs, len(pairs), count, (tokenizer, tokenizer))[:2]
        assert validation == evaluated
        assert validation[0] == [sources[index] for index in left[:count]]  # independent of either
        # The warning counts the pairs left out before the last one scored.
        read = left[count - 1] + 1 if count <= len(left) else len(sources)
        skipped = sum(index < read for index in (1, 3, 5))
        assert [message for message in caplog.messages if "validation pairs" in message] == (
            [
                f"skipped {skipped} pair{'s' if skipped > 1 else ''} with an empty side in the first {read} validation "
                "pairs scored for BLEU (first at pair 2; a side the tokenizer encodes to no piece or that shows "
                "nothing)"
            ]
            if skipped
            else []
        )
