"""Special token ids, fixed for every jaxformer vocabulary.

The sentencepiece models jaxformer trains reserve these ids, so a checkpoint and its
tokenizer always agree on them:

    0  <pad>  padding; never attended to, never a target
    1  </s>   end of sentence, the last target token
    2  <unk>  unknown piece
    3  <s>    beginning of sentence, the first decoder input (teacher forcing)

A vocabulary for a masked-LM (an encoder-only model) also holds MASK_PIECE, a control piece
that no text encodes to; `Tokenizer.mask_id` is its id.
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is not imported here: the commands' launcher imports this module before any heavy one
    import numpy as np

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3
NUM_SPECIAL_TOKENS = 4
MASK_PIECE = "<mask>"
# Characters that show nothing, by Unicode category: format characters (zero-width space and
# joiners, a byte-order mark, a soft hyphen, direction marks, bidi isolates), controls, spaces
# and line or paragraph separators.
INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp"})


def has_pieces(ids: np.ndarray) -> bool:
    """Whether a sentence's ids hold a piece besides EOS: whitespace, and characters a tokenizer's
    normaliser drops (zero-width spaces, a byte-order mark, control characters), encode to none,
    which is no sentence to train on, score or translate. decoding/sentence_batches.py keeps its
    own copy of this rule, taking the export's EOS id: exports ship that file without jaxformer."""
    return bool((ids != EOS_ID).any())


def has_visible_text(text: str) -> bool:
    """Whether `text` holds a character that shows (not of INVISIBLE_CATEGORIES). Text that holds
    none is no sentence, as an empty one is, whatever it encodes to: the tokenizer's normaliser
    drops some such characters and keeps others (NUL, C1 controls, a zero-width joiner, a soft
    hyphen, a bidi isolate) as an unknown piece, which a model would give an invented translation.
    decoding/sentence_batches.py keeps its own copy (`visible_text`) for the exports."""
    return any(unicodedata.category(character) not in INVISIBLE_CATEGORIES for character in text)
