"""evaluate's choice of the pairs it scores: read only as far as --max_examples needs."""

import logging

import numpy as np

from jaxformer.commands import evaluate
from jaxformer.data import scored_pairs
from jaxformer.data.parallel_text import SkipCounter, read_parallel_lines
from jaxformer.data.pipeline import pairs_of_no_piece
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.tokens import EOS_ID


class _SpaceTokenizer:
    """One piece per word, EOS alone for a line of no word (as sentencepiece for "\u200b")."""

    def encode(self, lines):
        return [np.array([5] * len(line.split()) + [EOS_ID]) for line in lines]


class _NoPiece:
    """EOS alone for every line: a tokenizer that knows none of the references' text."""

    def encode(self, lines):
        return [np.array([EOS_ID]) for _ in lines]


def _pairs(lines, read):
    for number, (source, reference) in enumerate(lines, start=1):
        read.append(number)
        yield number, source, reference


def test_max_examples_stops_reading_once_that_many_pairs_are_scored(monkeypatch, caplog):
    monkeypatch.setattr(scored_pairs, "ENCODE_CHUNK", 2)
    lines = [("a b", "x"), (" ", "y"), ("c", "z"), ("d", "w")] + [("e", "v")] * 100
    read: list[int] = []
    tokenizers = (_SpaceTokenizer(), _SpaceTokenizer())
    with caplog.at_level(logging.WARNING):
        sources, references, file_lines = evaluate._first_scored("f", _pairs(lines, read), 104, 3, tokenizers)
    assert (sources, references) == (["a b", "c", "d"], ["x", "z", "w"])
    assert max(read) <= 6, read  # two chunks of two, then at most the one look-ahead
    # The warning counts the lines read up to the last scored pair, not the file's 104.
    assert (file_lines.numbers, file_lines.total) == ([1, 3, 4], 4)
    assert "skipped 1 pair with an empty side in the first 4 lines of f (first at line 2 of its files)" in caplog.text


def test_without_max_examples_every_pair_is_read_and_counted(monkeypatch):
    monkeypatch.setattr(scored_pairs, "ENCODE_CHUNK", 2)
    lines = [("a", "x"), ("b", " "), ("c", "z")]
    read: list[int] = []
    tokenizers = (_SpaceTokenizer(), _SpaceTokenizer())
    sources, _, file_lines = evaluate._first_scored("f", _pairs(lines, read), 3, None, tokenizers)
    assert sources == ["a", "c"] and read == [1, 2, 3]
    assert (file_lines.numbers, file_lines.total) == ([1, 3], 3)


def test_files_with_sides_of_no_piece_get_one_count_in_one_warning(tmp_path, caplog):
    """A zero-width space or control characters alone are no piece to the tokenizer: left out with
    the empty lines, and the one warning counts them all and names the first of either kind; the
    reader, which knows no tokenizer, says the same words of the empty lines alone."""
    words = "one two three four five six seven eight nine ten".split()
    tokenizer = train_tokenizer(words * 3, vocab_size=20)
    sources = ["one two", "three", "\u200b", "four", "", "five", "six"]
    references = ["eins", "\x07\x1b", "zwei", "drei", "vier", "  ", "sechs"]
    source, reference = tmp_path / "t.en", tmp_path / "t.de"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    with caplog.at_level(logging.WARNING):
        scored_sources, scored_references, file_lines = evaluate.file_pairs(
            str(source), str(reference), None, (tokenizer, tokenizer)
        )
    assert scored_sources == ["one two", "four", "six"] and scored_references == ["eins", "drei", "sechs"]
    assert (file_lines.numbers, file_lines.total) == ([1, 4, 7], 7)
    assert [record.getMessage() for record in caplog.records if "empty side" in record.getMessage()] == [
        f"skipped 4 pairs with an empty side in the first 7 lines of {source} / {reference} (first at {reference}:2)"
        ": --output writes them as empty lines"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert [number for number, _, _ in read_parallel_lines(source, reference, SkipCounter())] == [1, 2, 3, 4, 7]
    assert caplog.messages == [f"skipped 2 pairs with an empty side in {source} / {reference} (first at {source}:5)"]


def test_pairs_of_no_piece_names_each_with_whether_its_source_is_one():
    """The rule evaluate and validation BLEU share (data/pipeline.py)."""
    sources = ["a b", " ", "c", "", "d"]
    references = ["x", "y", " ", "\t", "w"]
    tokenizers = (_SpaceTokenizer(), _SpaceTokenizer())
    assert pairs_of_no_piece(sources, references, tokenizers) == {1: True, 2: False, 3: True}
    # Each side is encoded by its own tokenizer: the references' leaves out every pair here.
    every = {index: not source.split() for index, source in enumerate(sources)}
    assert pairs_of_no_piece(sources, references, (_SpaceTokenizer(), _NoPiece())) == every
    assert pairs_of_no_piece([], [], tokenizers) == {}
