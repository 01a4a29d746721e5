"""The first N pairs a score reads (evaluate's --max_examples, validation BLEU's
training.bleu_examples, the final choice's data.max_eval_examples): N pairs whose sides both
encode to a piece and show something (`pairs_of_no_piece`), counted once the others are left
out, so that each reads the same sentences."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable

from jaxformer.data.pipeline import pairs_of_no_piece
from jaxformer.data.tokenizer import Tokenizer

# (a key saying where the pair is, source, reference)
Pair = tuple[Hashable, str, str]
# Pairs encoded at a time: a split of millions of pairs is read only as far as N needs.
ENCODE_CHUNK = 4096


def first_with_pieces(
    pairs: Iterable[Pair], count: int | None, tokenizers: tuple[Tokenizer, Tokenizer]
) -> tuple[list[Pair], dict[Hashable, bool]]:
    """(the pairs read whose sides both encode to a piece, {key: whether its source side is the one
    without a piece} of the others read). `pairs` are read and encoded `chunk` at a time until
    `count` (None: every pair) encode to a piece: the first list may run past `count` to the end of
    its chunk, and its first `count` are the ones scored."""
    scored: list[Pair] = []
    no_piece: dict[Hashable, bool] = {}
    pairs = iter(pairs)
    while count is None or len(scored) < count:
        read = list(itertools.islice(pairs, ENCODE_CHUNK))
        if not read:
            break
        left_out = pairs_of_no_piece([pair[1] for pair in read], [pair[2] for pair in read], tokenizers)
        for index, pair in enumerate(read):
            if index in left_out:
                no_piece[pair[0]] = left_out[index]
            else:
                scored.append(pair)
    return scored, no_piece
