"""Subword regularisation (Kudo, 2018): the training pairs' segmentations drawn afresh each time
they are read, so that a small corpus seen for dozens of epochs is not seen in one segmentation.

Each side of a training pair is one of its `nbest_size` most likely segmentations under the
unigram model, drawn with probability proportional to P(segmentation)^alpha (P the product of
its pieces' probabilities): alpha 0 draws uniformly among them, a large alpha almost always
gives the best one. The draw comes from the random generator the input pipeline hands each
record (grain's `random_map`, seeded by the record's place in the stream), not from
sentencepiece's own sampler, whose per-thread generator a resumed run could not reproduce:
a run resumed from a checkpoint reads the same segmentations it would have read.
Validation, BLEU and translation always use the best segmentation.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from jaxformer.data.tokenizer import Tokenizer, TokenizerError
from jaxformer.tokens import EOS_ID


@dataclasses.dataclass(frozen=True)
class SubwordSampling:
    """Draw among the `nbest_size` best segmentations, with probability proportional to P^alpha."""

    nbest_size: int
    alpha: float

    @classmethod
    def from_config(cls, tokenizer: ml_collections.ConfigDict) -> SubwordSampling | None:
        """The tokenizer section's sampling (tokenizer.sampling_nbest, tokenizer.sampling_alpha);
        None when sampling_nbest is 0."""
        if not tokenizer.sampling_nbest:
            return None
        return cls(int(tokenizer.sampling_nbest), float(tokenizer.sampling_alpha))

    def check(self, tokenizer: Tokenizer, where: str) -> None:
        """TokenizerError unless `tokenizer` (named by `where`) can give n-best segmentations."""
        if tokenizer.model_type != "unigram":
            raise TokenizerError(
                f"config tokenizer.sampling_nbest={self.nbest_size}: subword sampling needs a unigram "
                f"sentencepiece model, and {where} is a {tokenizer.model_type} model (set sampling_nbest=0)"
            )

    def encode(self, tokenizer: Tokenizer, text: str, rng: np.random.Generator) -> np.ndarray:
        """int32 ids of one drawn segmentation of `text`, EOS-terminated, as `Tokenizer.encode` gives."""
        candidates = tokenizer.nbest_encode(text, self.nbest_size)
        if len(candidates) > 1:
            scores = tokenizer.piece_log_probabilities
            log_probabilities = np.array([scores[ids].sum() for ids in candidates])  # log P of each
            weights = np.exp(self.alpha * (log_probabilities - log_probabilities.max()))
            chosen = candidates[rng.choice(len(candidates), p=weights / weights.sum())]
        else:
            chosen = candidates[0] if candidates else np.zeros(0, np.int32)
        return np.append(chosen, np.int32(EOS_ID)).astype(np.int32)
