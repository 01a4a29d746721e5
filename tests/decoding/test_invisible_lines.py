"""A line of characters that show nothing alone (a zero-width joiner, a soft hyphen, NUL, a bidi
isolate: what the tokenizer keeps as an unknown piece) was given an invented translation; it is
translated as the empty line it looks like, the lines named in one warning, and evaluate leaves
such a pair out. Whitespace alone is an empty line, as before, said by no warning."""

import logging

import numpy as np

from jaxformer.data.pipeline import pairs_of_no_piece
from jaxformer.decoding import sentence_batches
from jaxformer.tokens import EOS_ID, UNK_ID

# What nmt_nfkc keeps of such characters, each an unknown piece (tests/decoding/test_translator.py).
INVISIBLE = [
    "\x00",
    "\x85",
    "\u200d",
    "\xad",
    "\u2066\u2069",
    "\u200b\u200d",
    "\u200e\u200f\ufeff\u00ad",
    "\x00\u200d\n",
]
VISIBLE = ["A dog runs.", "\u200dA", "😀", "\ue000", "\u0301", "\u3164"]  # a letter, emoji, private use, marks


class UnknownPieces:
    """A tokenizer that keeps every character but whitespace, each an unknown piece."""

    def encode(self, text, add_eos=True):
        if isinstance(text, list):
            return [self.encode(one, add_eos) for one in text]
        return np.array([UNK_ID] * len("".join(text.split())) + [EOS_ID] * add_eos, dtype=np.int32)


def test_lines_of_invisible_characters_are_translated_as_empty_lines_and_named_once(caplog):
    sentences = ["A dog runs.", *INVISIBLE, "", " \t", *VISIBLE]
    with caplog.at_level(logging.WARNING):
        pieces, owners = sentence_batches.split_sentences(sentences, UnknownPieces(), 64, EOS_ID)
    visible = [0, *range(len(INVISIBLE) + 3, len(sentences))]
    assert owners == visible
    assert caplog.messages == [
        f"{len(INVISIBLE)} lines (2, 3, 4, 5, 6, 7, 8, 9) hold no visible character (format or control characters "
        "alone, such as a zero-width space or joiner; line 2: U+0000): translated as empty lines"
    ]
    decoded = [[(np.array([7]), -1.0)] for _ in pieces]
    results = sentence_batches.join_pieces(owners, decoded, len(sentences), lambda ids: "a translation")
    assert [index for index, result in enumerate(results) if result != [("", 0.0)]] == visible

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        pieces, _ = sentence_batches.split_sentences(["\u200d"] * 12, UnknownPieces(), 64, EOS_ID, range(101, 113))
    assert pieces == []
    assert caplog.messages[0].startswith(
        "12 lines (101, 102, 103, 104, 105, 106, 107, 108, 109, 110 and 2 more) hold no visible character"
    )
    assert caplog.messages[0].endswith("line 101: U+200D): translated as empty lines")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sentence_batches.split_sentences(["A dog.", "\u2066\u2069\r\n"], UnknownPieces(), 64, EOS_ID)
    assert caplog.messages[0].startswith("line 2 holds no visible character (")
    assert caplog.messages[0].endswith("line 2: U+2066 U+2069): translated as empty lines")


def test_evaluate_leaves_out_a_pair_with_a_side_of_invisible_characters():
    sources = ["A dog runs.", "\u200d", "A cat.", "A bird."]
    references = ["Un chien court.", "Un chat.", "\xad\u2066", "Un oiseau."]
    tokenizers = (UnknownPieces(), UnknownPieces())
    assert pairs_of_no_piece(sources, references, tokenizers) == {1: True, 2: False}
