"""Which validation pairs validation BLEU scores: those whose sides both encode to a piece."""

import logging

from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.training import validation_bleu


def test_pairs_with_a_side_of_no_piece_are_not_scored_and_are_said_once(caplog):
    """A zero-width space or control characters alone encode to EOS alone: translate would give the
    source an empty output, and BLEU would count it; left out as evaluate leaves it out."""
    words = "one two three four five six seven eight nine ten".split()
    tokenizer = train_tokenizer(words * 3, vocab_size=20)
    sources = ["one two", "three", "\u200b", "four"]
    references = ["eins", "\x07\x1b", "zwei", "drei"]
    with caplog.at_level(logging.WARNING):
        assert validation_bleu._with_pieces(sources, references, tokenizer, tokenizer) == [0, 3]
        assert validation_bleu._with_pieces(sources[:1], references[:1], tokenizer, tokenizer) == [0]
    assert caplog.messages == [
        "skipped 2 pairs with an empty side in the first 4 validation pairs scored for BLEU "
        "(first at pair 2; a side the tokenizer encodes to no piece)"
    ]
