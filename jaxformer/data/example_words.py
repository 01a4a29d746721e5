"""How the pipeline's messages name a split's examples: a translator's pairs, two sides that must
each show something, hold a piece and fit data.max_length, or a language model's texts, one side each
(text_sides.example_noun gives the noun the run's log uses: "pairs" or "texts")."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ExampleWords:
    examples: str  # the noun itself
    example: str
    counted: str  # a count of a split's examples ("none of the 300 examples fits")
    tokens_each: str  # data.max_length's unit
    with_no_piece: str  # after a count ("left out 4 with a side of no piece or nothing visible")
    had_no_piece: str  # of those drawn
    drawn_no_piece: str  # the one that was drawn
    every_no_piece: str  # after "every": why a split has nothing to read
    first_no_piece: str  # after the first one's place
    sides: int  # skipped_pairs_text's


_SPACES = "(zero-width spaces, joiners or control characters alone)"
_WORDS = {  # each field: (a translator's, a language model's), side by side
    "examples": ("pairs", "texts"),
    "example": ("pair", "text"),
    "counted": ("examples", "texts"),
    "tokens_each": ("tokens a side", "tokens"),
    "with_no_piece": ("with a side of no piece or nothing visible", "that encode to no piece or show nothing"),
    "had_no_piece": ("had a side of no piece or nothing visible", "encoded to no piece or showed nothing"),
    "drawn_no_piece": (
        "a pair with a side that encodes to no piece or shows nothing",
        "a text that encodes to no piece or shows nothing",
    ),
    "every_no_piece": (
        f"pair has a side the tokenizer encodes to no piece or that shows nothing {_SPACES}",
        f"text encodes to no piece or shows nothing {_SPACES}",
    ),
    "first_no_piece": (
        "a side the tokenizer encodes to no piece or that shows nothing",
        "the tokenizer encodes it to no piece or it shows nothing",
    ),
    "sides": (2, 1),
}
PAIRS, TEXTS = (ExampleWords(**{field: words[kind] for field, words in _WORDS.items()}) for kind in (0, 1))


def example_words(examples: str) -> ExampleWords:
    """The words of `examples`, the noun a run's log uses ("pairs" or "texts")."""
    return {words.examples: words for words in (PAIRS, TEXTS)}[examples]
