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

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is not imported here: the commands' launcher imports this module before any heavy one
    import numpy as np

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3
NUM_SPECIAL_TOKENS = 4
MASK_PIECE = "<mask>"


def has_pieces(ids: np.ndarray) -> bool:
    """Whether a sentence's ids hold a piece besides EOS: whitespace, and characters a tokenizer's
    normaliser drops (zero-width spaces, a byte-order mark, control characters), encode to none,
    which is no sentence to train on, score or translate. decoding/sentence_batches.py keeps its
    own copy of this rule, taking the export's EOS id: exports ship that file without jaxformer."""
    return bool((ids != EOS_ID).any())
