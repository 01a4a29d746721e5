"""The rule for a sentence of no piece: jaxformer.tokens.has_pieces, which the package uses, and
the copy that decoding/sentence_batches.py keeps for the exports it is copied into (which ship
without jaxformer) say the same of every sentence."""

import numpy as np
import pytest

from jaxformer.decoding import sentence_batches
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID, has_pieces

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
