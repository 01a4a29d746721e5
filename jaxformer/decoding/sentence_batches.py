"""From sentences to padded, length-sorted batches of ids and back: what `Translator` and an
export's serve.py do around their search.

This module imports only the standard library and numpy, because `jaxformer-export` copies it
into every export beside serve.py (jaxformer/export/standalone.py), which runs where jaxformer is
not installed. Both translators calling this one copy is what makes their results equal.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
LINE_BREAK = re.compile(r"\r\n|[\r\n]")  # what a reader of lines splits at; U+2028, form feeds are text

# The longest piece a source line is translated in (Translator's max_source_tokens, the commands'
# --max_source_tokens), where the model has no last position (model.max_positions None: the
# sinusoids are computed for any position): as generate.py's MAX_EXTRA_LENGTH, it stops a mistyped value (10**20
# would let one long line build a search over its whole length, out of memory) before anything is
# read. A model with positions takes at most that many (translator.source_token_limit).
MAX_SOURCE_TOKENS = 4096  # generate.py's MAX_EXTRA_LENGTH: 16 times the longest rows the shipped configs train on
DEFAULT_MAX_SOURCE_TOKENS = 256  # where none is given: at most the model's positions
# jaxformer.tokens.INVISIBLE_CATEGORIES: Unicode categories of the characters that show nothing.
INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp"})
NAMED_LINES = 10  # the invisible lines a warning names by number; the others are counted


def as_lines(texts: Iterable[str]) -> str:
    """One line per text, each ended by \\n: a line break inside a text becomes a space, so line N
    of the output answers line N of the input."""
    return "".join(LINE_BREAK.sub(" ", text) + "\n" for text in texts)


Hypotheses = list[tuple[str, float]]  # (text, score), best first


@runtime_checkable
class Encoder(Protocol):
    def encode(self, text: str, add_eos: bool = True) -> np.ndarray: ...


def sentence_list(sentences: Iterable[str]) -> list[str]:
    """`sentences` read once into a list (a list, a generator, a file's lines), each checked to be
    a str, before anything is decoded: the results are joined per sentence once all are decoded,
    and a generator can be read only once."""
    if isinstance(sentences, (str, bytes)):  # iterating would translate each character
        raise TypeError(f"sentences must be a list of str, not one {type(sentences).__name__}: pass [sentence]")
    try:
        listed = list(sentences)
    except TypeError:
        if hasattr(sentences, "__iter__") or hasattr(sentences, "__getitem__"):
            raise  # an iterable whose iteration failed: its own error
        raise TypeError(
            f"sentences must be an iterable of str (a list, a generator, a file), not {type(sentences).__name__}"
        ) from None
    for index, sentence in enumerate(listed):
        if not isinstance(sentence, str):
            raise TypeError(f"sentence {index} is {type(sentence).__name__}, not str")
        refuse_unencodable(sentence, index)
    return listed


def refuse_unencodable(sentence: str, index: int) -> None:
    """A str that is no Unicode text (a lone surrogate, as json.loads makes of "\\ud800" or
    surrogateescape of a byte that is not UTF-8) has no UTF-8 for sentencepiece: named here, with
    its index and position, where the tokenizer would fail naming neither."""
    try:
        sentence.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"sentence {index} is not valid Unicode text: {sentence[error.start]!r} at character {error.start} "
            "is a lone surrogate, which has no UTF-8"
        ) from None


def padded_rows(source: Any, pad_id: int) -> np.ndarray:
    """`source`, padded rows of ids [B, S] (an export's translate_ids takes them), as an array; rows
    of several lengths (a list of lists) are named in one line, where numpy's error names none."""
    try:
        return np.asarray(source)
    except ValueError:
        lengths = [len(row) if isinstance(row, Sized) else None for row in source]
        other = next((row for row, length in enumerate(lengths) if length != lengths[0]), None)
        if other is None:
            raise
        raise ValueError(
            f"source must be padded rows of ids [B, S], all of one length: row 0 has {lengths[0]} ids and row "
            f"{other} {lengths[other]}; pad each row after its EOS with PAD ({pad_id}), or pass the rows to "
            "translate_sequences"
        ) from None


def has_pieces(ids: np.ndarray, eos_id: int) -> bool:
    """Whether a sentence's ids hold a piece besides EOS: whitespace, and characters a tokenizer's
    normaliser drops (zero-width spaces, a byte-order mark, control characters), encode to none,
    which is no sentence to translate (a source of EOS alone would be given an invented one).
    jaxformer.tokens.has_pieces is the package's rule; this copy stays because an export ships this
    file without jaxformer (tests/test_tokens.py checks that the two agree)."""
    return bool(np.any(ids != eos_id))


def visible_text(sentence: str) -> bool:
    """jaxformer.tokens.has_visible_text, the package's rule, which this copy follows for the
    exports (tests/test_tokens.py checks that the two agree): a sentence of characters that show
    nothing is no sentence, as an empty one is, even where the tokenizer keeps one as unknown."""
    return any(unicodedata.category(character) not in INVISIBLE_CATEGORIES for character in sentence)


def without_trailing_padding(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """`ids` up to their last id other than PAD: the padding after a padded row's EOS, which is no
    part of its sentence, dropped; PAD before that stays (`refuse_other_than_one_sentence` refuses it)."""
    kept = np.flatnonzero(ids != pad_id)
    return ids[: kept[-1] + 1] if kept.size else ids[:0]


def refuse_other_than_one_sentence(
    ids: np.ndarray, eos_id: int, name: str, pad_id: int, max_positions: int | None = None
) -> None:
    """A one-line error naming `name` (and the position) for ids that are not one sentence's,
    optionally followed by padding (PAD after its EOS, as in a row of a padded [B, S] array, which
    `without_trailing_padding` drops): not 1-D, empty or padding alone, not integers (a bool or float
    would be cast when a batch is filled), EOS alone (decoded, it would get an invented output;
    `translate` gives a line that encodes to no piece an empty one), a last id before the padding other
    than EOS, EOS before it (sentences run together), or PAD before it (the model's mask would drop that
    token silently: no tokenizer gives a sentence PAD), or more ids than the model's `max_positions` (None:
    no bound; an imported model's), whose positions past the last it never had: the text entry points
    split such a sentence, but ids from a program are exact, so none is cut or split here. The model was
    trained on single sentences ending in EOS. Both translators' id-level entry points call this, so they
    refuse in the same words."""
    if ids.ndim != 1:
        raise ValueError(f"{name} must be one sentence's ids (1-D), got shape {ids.shape}")
    if ids.size == 0:
        raise ValueError(f"{name} is empty: a sentence's ids end with EOS ({eos_id})")
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name}'s ids must be integers, got dtype {ids.dtype}")
    sentence = without_trailing_padding(ids, pad_id)
    if sentence.size == 0:
        raise ValueError(f"{name} is PAD ({pad_id}) alone: a sentence's ids end with EOS ({eos_id})")
    if sentence.size == 1 and sentence[0] == eos_id:
        raise ValueError(
            f"{name} is EOS ({eos_id}) alone: no sentence to translate (translate gives a line that encodes "
            "to no piece an empty output)"
        )
    end = sentence.size - 1
    if sentence[-1] != eos_id:
        padded = " (before its padding)" if sentence.size < ids.size else ""
        raise ValueError(
            f"{name} ends with id {sentence[-1]} at position {end}{padded}, not EOS ({eos_id}): "
            "a sentence's ids end with EOS"
        )
    early = np.flatnonzero(sentence[:-1] == eos_id)
    if early.size:
        raise ValueError(
            f"{name} has EOS ({eos_id}) at position {early[0]}, before its end at position {end}: "
            "one sentence per source"
        )
    padding = np.flatnonzero(sentence == pad_id)
    if padding.size:
        raise ValueError(
            f"{name} has PAD ({pad_id}) at position {padding[0]}, before its EOS at position {end}: "
            "padding goes only after a sentence's EOS"
        )
    if max_positions is not None and sentence.size > max_positions:
        raise ValueError(
            f"{name} has {sentence.size} ids (EOS included), more than the model's {max_positions} positions "
            "(model.max_positions): give it in pieces of at most that many, as translate splits a longer sentence"
        )


def split_sentences(
    sentences: Iterable[str],
    tokenizer: Encoder,
    max_source_tokens: int,
    eos_id: int,
    line_numbers: Sequence[int] | None = None,
) -> tuple[list[np.ndarray], list[int]]:
    """(pieces, owners): the source ids to decode, each ending in EOS, and the index of the
    sentence each piece comes from. An empty sentence has no piece, nor has one of invisible
    characters alone (`visible_text`), whose lines one warning names unless they are blank;
    one longer than `max_source_tokens` has several (see `split_sentence`). `line_numbers`: each
    sentence's line in the user's file, which a warning names (default: its index + 1), where
    lines were left out."""
    sentences = sentence_list(sentences)
    if line_numbers is not None and len(line_numbers) != len(sentences):
        raise ValueError(f"{len(line_numbers)} line numbers for {len(sentences)} sentences")
    pieces, owners, invisible = [], [], []
    for index, sentence in enumerate(sentences):
        line = index + 1 if line_numbers is None else line_numbers[index]
        if not visible_text(sentence) and not all(_is_blank(character) for character in sentence):
            invisible.append((line, sentence))
        for piece in split_sentence(sentence, tokenizer, max_source_tokens, eos_id, index, line):
            pieces.append(piece)
            owners.append(index)
    if invisible:
        _warn_invisible(invisible)
    return pieces, owners


def _is_blank(character: str) -> bool:
    """Whether `character` is a space, tab or line break: a line of them looks empty, and is."""
    return character in "\t\n\r" or unicodedata.category(character) in ("Zs", "Zl", "Zp")


def _warn_invisible(invisible: list[tuple[int, str]]) -> None:
    """One warning naming the lines (line number, text) of characters that show nothing alone,
    and the first one's characters: each is translated as an empty line, as the user is told."""
    numbers = ", ".join(str(line) for line, _ in invisible[:NAMED_LINES])
    more = f" and {len(invisible) - NAMED_LINES:,} more" if len(invisible) > NAMED_LINES else ""
    lines = f"line {numbers} holds" if len(invisible) == 1 else f"{len(invisible):,} lines ({numbers}{more}) hold"
    first = " ".join(f"U+{ord(character):04X}" for character in invisible[0][1].rstrip("\r\n")[:8])
    logger.warning(
        "%s no visible character (format or control characters alone, such as a zero-width space or "
        "joiner; line %d: %s): translated as empty lines",
        lines,
        invisible[0][0],
        first,
    )


def split_sentence(
    sentence: str, tokenizer: Encoder, max_source_tokens: int, eos_id: int, index: int = 0, line: int | None = None
) -> list[np.ndarray]:
    """Source ids of a sentence: none for an empty one, which the tokenizer encodes to no piece
    (`has_pieces`) or which shows nothing (`visible_text`); for one longer than `max_source_tokens`,
    pieces cut at sentence ends where it can and every `max_source_tokens` - 1 tokens where it
    cannot, so that nothing is dropped. `index` (0-based) and `line` (1-based, default index + 1)
    place it in the warning, counted from 1."""
    if not visible_text(sentence):
        return []
    ids = tokenizer.encode(sentence)
    if not has_pieces(ids, eos_id):
        return []
    if len(ids) <= max_source_tokens:
        return [ids]
    logger.warning(
        "sentence %d (line %d) has %d tokens, more than max_source_tokens=%d: translating it in pieces",
        index + 1,  # counted from 1, as lines are: the line differs where lines were left out
        index + 1 if line is None else line,
        len(ids),
        max_source_tokens,
    )
    chunks, current = [], ""
    for part in SENTENCE_END.split(sentence):
        candidate = f"{current} {part}".strip()
        if current and len(tokenizer.encode(candidate)) > max_source_tokens:
            chunks.append(current)
            candidate = part
        current = candidate
    chunks.append(current)
    pieces, step = [], max_source_tokens - 1  # room for EOS
    for chunk in chunks:
        ids = tokenizer.encode(chunk, add_eos=False)
        for start in range(0, len(ids), step):
            pieces.append(np.append(ids[start : start + step], eos_id).astype(np.int32))
    return pieces


def length_sorted_batches(
    sources: Sequence[np.ndarray],
    batch_size: int,
    length_bucket: int,
    pad_id: int,
    eos_id: int,
    *,
    compiled_lengths: set[int] | None = None,
    max_buffer_growth: float = 1.0,
    extra_length: int = 0,
) -> Iterator[tuple[list[int], np.ndarray]]:
    """(indices into `sources`, int32 [R, S]) batches, longest sources first. R is `batch_size`,
    or for fewer sources the power of two that holds them all (a few rows are not decoded as
    thousands); a batch short of rows is filled with empty sentences, which stop at once. S is
    `padded_length` of the batch's longest row: its bucket, or with `max_buffer_growth` > 1 one
    of `compiled_lengths` (the source lengths a search was compiled for; each S picked is added
    to it)."""
    known = set() if compiled_lengths is None else compiled_lengths
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    rows = min(batch_size, 1 << max(len(sources) - 1, 0).bit_length())
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        longest = max(len(sources[i]) for i in indices)
        length = padded_length(longest, length_bucket, known, max_buffer_growth, extra_length)
        known.add(length)
        batch = np.full((rows, length), pad_id, np.int32)
        batch[len(indices) :, 0] = eos_id
        for row, index in enumerate(indices):
            batch[row, : len(sources[index])] = sources[index]
        yield indices, batch


def padded_length(
    longest: int,
    length_bucket: int,
    compiled_lengths: Iterable[int] = (),
    max_buffer_growth: float = 1.0,
    extra_length: int = 0,
) -> int:
    """The source length S a batch whose longest row has `longest` tokens is padded to: its
    bucket (`longest` rounded up to a multiple of `length_bucket`), or the shortest of
    `compiled_lengths` that is longer but keeps the search's buffer, S + `extra_length` tokens
    (the output limit), within `max_buffer_growth` times the bucket's.

    A new S costs a compilation of the whole search (seconds); a longer S costs every step of
    the batch's search in proportion to the buffer, whose cached keys and values beam search
    reorders at each step (padding a Multi30k batch from 16 to 48 source tokens, with 50 extra:
    a third more time). Results do not depend on S: a row's output is its own however padded
    (tests/decoding/test_batch_shapes.py)."""
    bucket = length_bucket * math.ceil(longest / length_bucket)
    most = max_buffer_growth * (bucket + extra_length) - extra_length
    return min((length for length in compiled_lengths if bucket <= length <= most), default=bucket)


def join_pieces(
    owners: Sequence[int],
    decoded: Sequence[Sequence[tuple[np.ndarray, float]]],
    sentence_count: int,
    decode: Callable[[np.ndarray], str],
) -> list[Hypotheses]:
    """Per sentence, its hypotheses (text, score) best first: a one-piece sentence keeps its
    piece's; a long sentence's are the best combinations of its pieces' hypotheses, one per piece
    joined by spaces with their scores summed, as many as a piece has; an empty sentence gives
    [("", 0.0)]. Each text is `decode`'s without whitespace at its ends, as fairseq's and
    transformers' sentencepiece detokenizers strip it: a hypothesis cut at the length limit can
    end in a lone word-start piece, "▁", which sentencepiece decodes to a trailing space."""
    results: list[Hypotheses] = [[] for _ in range(sentence_count)]
    for owner, hypotheses in zip(owners, decoded):
        texts = [(decode(tokens).strip(), score) for tokens, score in hypotheses]
        if not results[owner]:
            results[owner] = texts
        else:
            combined = [
                (f"{before} {after}".strip(), before_score + after_score)
                for before, before_score in results[owner]
                for after, after_score in texts
            ]
            combined.sort(key=lambda hypothesis: -hypothesis[1])  # stable: ties keep the pieces' order
            results[owner] = combined[: len(texts)]
    return [result or [("", 0.0)] for result in results]
