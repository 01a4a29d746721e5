"""Pairs with a side the tokenizer encodes to no piece (a zero-width space or control characters
alone: EOS alone): left out of the training batches and of evaluation, counted and said in one
warning (before training where the split is encoded once, else when the first is drawn), and a
split of such pairs alone refused saying so, not to raise data.max_length."""

import logging

import numpy as np
import pytest

from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import LengthFilter, TokenizePair, eval_batches
from jaxformer.data.subword_sampling import SubwordSampling
from jaxformer.tokens import EOS_ID
from tests.data.test_pipeline import MAX_LENGTH, corpus, data_section, kept_pairs, make, unpack  # noqa: F401 (corpus: the fixture)

NO_PIECE = [{"en": "\u200b".encode(), "de": b"ein hund"}, {"en": b"a dog", "de": b"\x07\x1b"}]
# Sides that show nothing but that the tokenizer keeps, as an unknown piece: a lone zero-width
# joiner; a soft hyphen, a bidi isolate and NUL.
SHOWS_NOTHING = [{"en": "\u200d".encode(), "de": b"ein hund"}, {"en": b"a dog", "de": "\u00ad\u2066\x00".encode()}]


@pytest.mark.parametrize("encode_once", [True, False])
def test_pairs_with_a_side_of_no_piece_are_not_trained_on_and_are_said_once(corpus, encode_once, caplog):  # noqa: F811
    """A zero-width space or control characters alone encode to EOS alone: such a pair is left out
    of the training batches and of evaluation, as evaluate leaves it out; counted and said in one
    warning before training where the split is encoded once, else when the first one is drawn."""
    records, tokenizer = corpus
    assert all(len(tokenizer.encode(text)) == 1 for text in ("\u200b", "\x07\x1b"))  # EOS alone
    with_holes = [*records[:10], NO_PIECE[0], *records[10:20], NO_PIECE[1], *records[20:]]
    length_filter = LengthFilter(MAX_LENGTH)
    with caplog.at_level(logging.WARNING):
        batches = iter(
            make((with_holes, tokenizer), length_filter, encode_once_max_examples=10**6 if encode_once else 0)
        )
        said_before_training = [message for message in caplog.messages if "no piece" in message]
        pairs = []
        while length_filter.seen < 2 * len(with_holes):  # two epochs
            pairs += unpack(next(batches))
    assert not any(len(side) == 1 for pair in pairs for side in pair)
    assert set(pairs) == set(kept_pairs(corpus))  # every other pair is trained on
    said = [message for message in caplog.messages if "no piece" in message]
    assert (
        length_filter.no_piece == 2 * 2
        and "left out 4 with a side of no piece or nothing visible" in length_filter.dropped_since(0)
    )
    if encode_once:
        assert (
            said
            == said_before_training
            == [
                "skipped 2 pairs with an empty side in the training split "
                "(first at pair 11; a side the tokenizer encodes to no piece or that shows nothing)"
            ]
        )
    else:
        assert said_before_training == [] and len(said) == 1 and said[0].startswith("training: a pair with a side")

    caplog.clear()
    data = data_section()
    with caplog.at_level(logging.WARNING):
        evaluated = eval_batches(with_holes, TokenizePair.for_data(data, tokenizer), data)
    assert sorted(pair for batch in evaluated for pair in unpack(batch)) == sorted(kept_pairs(corpus))
    assert [message for message in caplog.messages if "no piece" in message] == [
        "skipped 2 pairs with an empty side in the validation split "
        "(first at pair 11; a side the tokenizer encodes to no piece or that shows nothing)"
    ]


@pytest.mark.parametrize("encode_once", [True, False])
def test_a_split_of_pairs_with_no_piece_alone_says_so_not_to_raise_max_length(corpus, encode_once):  # noqa: F811
    _, tokenizer = corpus
    holes = NO_PIECE * 3  # every pair has a side of no piece
    overrides = dict(encode_once_max_examples=1_000_000 if encode_once else 0)
    if encode_once:
        with pytest.raises(
            DataError, match=r"^training: every pair has a side the tokenizer encodes to no piece .*6 pairs$"
        ):
            make((holes, tokenizer), **overrides)
    else:
        with pytest.raises(
            DataError, match=r"all longer \(0 so far: raise data.max_length\) or had a side of no piece"
        ):
            next(iter(make((holes, tokenizer), **overrides)))
    with pytest.raises(DataError, match=r"^validation: every pair has a side the tokenizer encodes to no piece"):
        eval_batches(holes, TokenizePair.for_data(data_section(), tokenizer), data_section())


@pytest.mark.parametrize("encode_once", [True, False])
def test_pairs_with_a_side_that_shows_nothing_are_left_out_as_those_of_no_piece(corpus, encode_once, caplog):  # noqa: F811
    """A side of characters that show nothing alone is no sentence, as evaluate and translate read
    it (jaxformer.tokens.has_visible_text), though the tokenizer encodes it to an unknown piece:
    such a pair is left out of training and evaluation, counted and said as a pair of no piece is."""
    records, tokenizer = corpus
    records = records[:30]  # an epoch of 32 pairs: fast
    assert len(tokenizer.encode("\u200d")) > 1 and len(tokenizer.encode("\u00ad\u2066\x00")) > 1  # a piece
    with_holes = [*records[:10], SHOWS_NOTHING[0], *records[10:20], SHOWS_NOTHING[1], *records[20:]]
    length_filter = LengthFilter(MAX_LENGTH)
    with caplog.at_level(logging.WARNING):
        batches = iter(
            make((with_holes, tokenizer), length_filter, encode_once_max_examples=10**6 if encode_once else 0)
        )
        pairs = []
        while length_filter.seen < len(with_holes):  # an epoch
            pairs += unpack(next(batches))
    assert set(pairs) <= set(kept_pairs((records, tokenizer)))  # neither pair is trained on
    left_out = length_filter.no_piece  # each one drawn: 2 an epoch, and those of the next epoch read ahead
    assert left_out >= 2 and f"left out {left_out} with a side of no piece or nothing" in length_filter.dropped_since(0)
    said = [message for message in caplog.messages if "no piece" in message]
    first = "(first at pair 11; a side the tokenizer encodes to no piece or that shows nothing)"
    if encode_once:
        assert said == [f"skipped 2 pairs with an empty side in the training split {first}"]
    else:
        assert len(said) == 1 and said[0].startswith("training: a pair with a side that encodes to no piece or shows")

    caplog.clear()
    data = data_section()
    with caplog.at_level(logging.WARNING):
        evaluated = eval_batches(with_holes, TokenizePair.for_data(data, tokenizer), data, split="test")
    assert sorted(pair for batch in evaluated for pair in unpack(batch)) == sorted(kept_pairs((records, tokenizer)))
    assert [message for message in caplog.messages if "no piece" in message] == [
        f"skipped 2 pairs with an empty side in the test split {first}"  # data.eval_split's name
    ]


def test_a_side_that_shows_nothing_is_encoded_as_an_empty_one_however_it_is_encoded(corpus):  # noqa: F811
    """Streamed, encoded once, or a drawn segmentation (subword sampling): EOS alone, the other side as it is."""
    _, tokenizer = corpus
    tokenize = TokenizePair.for_data(data_section(), tokenizer, sampling=SubwordSampling(8, 0.1))
    rng = np.random.default_rng(0)
    for record, empty, other in zip(SHOWS_NOTHING, ("inputs", "targets"), ("targets", "inputs")):
        for encoded in (tokenize(record), tokenize.sample(record, rng), tokenize.encode_all([record])[0]):
            assert encoded[empty].tolist() == [EOS_ID] and len(encoded[other]) > 1
