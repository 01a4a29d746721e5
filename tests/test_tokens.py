"""The rules for a sentence of no piece and for one that shows nothing: jaxformer.tokens.has_pieces
and has_visible_text, which the package uses, and the copies that decoding/sentence_batches.py
keeps for the exports it is copied into (which ship without jaxformer) say the same of every sentence."""

import numpy as np
import pytest

from jaxformer.decoding import sentence_batches
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID, has_pieces, has_visible_text

IDS = {
    "EOS alone": [EOS_ID],
    "EOS twice": [EOS_ID, EOS_ID],
    "no id": [],
    "a piece and EOS": [7, EOS_ID],
    "unknown piece and EOS": [UNK_ID, EOS_ID],
    "a piece, no EOS": [7],
    "EOS then padding": [EOS_ID, PAD_ID],
    "BOS and EOS": [BOS_ID, EOS_ID],
}


@pytest.mark.parametrize("name", IDS)
def test_the_packages_rule_and_the_exports_copy_agree(name):
    ids = np.array(IDS[name], dtype=np.int32)
    expected = any(i != EOS_ID for i in IDS[name])  # by hand: any id besides EOS
    assert has_pieces(ids) is expected
    assert sentence_batches.has_pieces(ids, EOS_ID) is expected


SHOW_NOTHING = ["", " ", "\u200b", "\u200d", "\x00", "\x85", "\xad", "\u2066\u2069", "\ufeff", "\u3000"]
SHOW = ["A", "\u200dA", "😀", "\ue000", "\u0301"]  # a letter after a joiner, emoji, private use, a mark


def test_the_rule_for_text_that_shows_nothing_and_the_exports_copy_agree():
    """Format and control characters and spaces alone show nothing: an empty sentence to translate
    and to score, whatever the tokenizer encodes them to; a letter, an emoji, a private-use glyph or
    a combining mark shows."""
    for text in SHOW_NOTHING + SHOW:
        assert has_visible_text(text) is sentence_batches.visible_text(text) is (text in SHOW), repr(text)
