"""evaluate's choice of the pairs it scores: read only as far as --max_examples needs."""

import logging

import numpy as np

from jaxformer.commands import evaluate
from jaxformer.tokens import EOS_ID


class _SpaceTokenizer:
    """One piece per word, EOS alone for a line of no word (as sentencepiece for "\u200b")."""

    def encode(self, lines):
        return [np.array([5] * len(line.split()) + [EOS_ID]) for line in lines]


def _pairs(lines, read):
    for number, (source, reference) in enumerate(lines, start=1):
        read.append(number)
        yield number, source, reference


def test_max_examples_stops_reading_once_that_many_pairs_are_scored(monkeypatch, caplog):
    monkeypatch.setattr(evaluate, "_ENCODE_CHUNK", 2)
    lines = [("a b", "x"), (" ", "y"), ("c", "z"), ("d", "w")] + [("e", "v")] * 100
    read: list[int] = []
    tokenizers = (_SpaceTokenizer(), _SpaceTokenizer())
    with caplog.at_level(logging.WARNING):
        sources, references, file_lines = evaluate._first_scored("f", _pairs(lines, read), 104, 3, tokenizers)
    assert (sources, references) == (["a b", "c", "d"], ["x", "z", "w"])
    assert max(read) <= 6, read  # two chunks of two, then at most the one look-ahead
    # The warning counts the lines read up to the last scored pair, not the file's 104.
    assert (file_lines.numbers, file_lines.total) == ([1, 3, 4], 4)
    assert "1 of its first 4 lines are not scored" in caplog.text


def test_without_max_examples_every_pair_is_read_and_counted(monkeypatch):
    monkeypatch.setattr(evaluate, "_ENCODE_CHUNK", 2)
    lines = [("a", "x"), ("b", " "), ("c", "z")]
    read: list[int] = []
    tokenizers = (_SpaceTokenizer(), _SpaceTokenizer())
    sources, _, file_lines = evaluate._first_scored("f", _pairs(lines, read), 3, None, tokenizers)
    assert sources == ["a", "c"] and read == [1, 2, 3]
    assert (file_lines.numbers, file_lines.total) == ([1, 3], 3)
