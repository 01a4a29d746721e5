"""What each architecture learns from a batch: the model's outputs under teacher forcing, and
the targets and weights that the one label-smoothed loss (loss.py, output_loss.py) reads.

- Translation (encoder_decoder): the decoder reads shift_right(targets) and the encoder the
  source (`inputs`); every target token that is not padding counts.
- Masked LM (encoder_only): the encoder reads `inputs` with BERT's masking (mlm_masking.py);
  only the masked positions count.
- Causal LM (decoder_only): the decoder reads shift_right(targets); every target token counts.

A batch's features are "inputs" (the source side's text) and "targets" (the target side's):
the masked LM reads data.source_language's text, the causal LM data.target_language's, the
sides they take when they initialise a translator.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.data.parallel_text import DataError
from jaxformer.model.config import TransformerConfig
from jaxformer.model.transformer import shift_right
from jaxformer.tokens import PAD_ID
from jaxformer.training.mlm_masking import MaskedTokens, mask_tokens

Batch = Mapping[str, jax.Array]
# Keys of a masked-LM evaluation batch whose masking was drawn once, ahead of time.
MASKED_TARGETS, MASKED_WEIGHTS = "masked_targets", "masked_weights"
_MASKING_STREAM = 1  # folded into the step's key: the masking draws apart from dropout's


def _not_padding(tokens: jax.Array) -> jax.Array:
    return (tokens != PAD_ID).astype(jnp.float32)


def _apply(model: nn.Module, params: Any, args: tuple, kwargs: dict, deterministic: bool, rng, project: bool):
    """The model on teacher-forced inputs: logits, or (hidden, output embedding) without `project`."""
    return model.apply(
        {"params": params},
        *args,
        **kwargs,
        deterministic=deterministic,
        rngs=None if rng is None else {"dropout": rng},
        method=None if project else type(model).hidden_states,
    )


# How to evaluate more examples where those evaluated are too few (a masking that selects none of
# their tokens): the run says which of its settings reads more (`evaluation_remedy`).
MORE = "evaluate more of them (data.max_eval_examples)"


@dataclasses.dataclass(frozen=True)
class Objective:
    """An architecture's objective. `forward` gives (logits [B, L, V], or (hidden [B, L, D],
    output embedding [V, D]) without `project`; targets [B, L]; float32 weights [B, L]); dropout
    (and masking) keyed by `rng`, None when deterministic."""

    features: ClassVar[tuple[str, ...]]  # the packed features it reads: "inputs" and/or "targets"

    def forward(self, model: nn.Module, params: Any, batch: Batch, deterministic: bool, rng, project: bool):
        raise NotImplementedError

    def evaluation_batches(self, batches: list[dict[str, np.ndarray]], more: str = MORE) -> list[dict[str, np.ndarray]]:
        """The evaluation batches as `forward` reads them (drawn once for the whole run); `more`: how
        to evaluate more examples, where these are too few to score."""
        return batches


@dataclasses.dataclass(frozen=True)
class Translation(Objective):
    """The encoder-decoder's objective (the paper's)."""

    features: ClassVar[tuple[str, ...]] = ("inputs", "targets")

    def forward(self, model: nn.Module, params: Any, batch: Batch, deterministic: bool, rng, project: bool):
        segments = batch.get("targets_segment_ids")
        args = (batch["inputs"], shift_right(batch["targets"], segments))
        kwargs = dict(
            source_segments=batch.get("inputs_segment_ids"),
            target_segments=segments,
            source_positions=batch.get("inputs_positions"),
            target_positions=batch.get("targets_positions"),
        )
        outputs = _apply(model, params, args, kwargs, deterministic, rng, project)
        return outputs, batch["targets"], _not_padding(batch["targets"])


@dataclasses.dataclass(frozen=True)
class CausalLanguageModel(Objective):
    """The decoder-only model's objective: the next token of the target side's text."""

    features: ClassVar[tuple[str, ...]] = ("targets",)

    def forward(self, model: nn.Module, params: Any, batch: Batch, deterministic: bool, rng, project: bool):
        segments = batch.get("targets_segment_ids")
        args = (shift_right(batch["targets"], segments), segments, batch.get("targets_positions"))
        outputs = _apply(model, params, args, {}, deterministic, rng, project)
        return outputs, batch["targets"], _not_padding(batch["targets"])


@dataclasses.dataclass(frozen=True)
class MaskedLanguageModel(Objective):
    """The encoder-only model's objective: the masked tokens of the source side's text."""

    mask_id: int
    vocab_size: int
    seed: int = 0  # draws the evaluation batches' masking, the same at every evaluation

    features: ClassVar[tuple[str, ...]] = ("inputs",)

    def masked(self, rng: jax.Array, tokens: jax.Array) -> MaskedTokens:
        return mask_tokens(rng, tokens, self.mask_id, self.vocab_size)

    def forward(self, model: nn.Module, params: Any, batch: Batch, deterministic: bool, rng, project: bool):
        if MASKED_TARGETS in batch:  # an evaluation batch, masked ahead of time
            inputs, targets, weights = batch["inputs"], batch[MASKED_TARGETS], batch[MASKED_WEIGHTS]
        else:
            inputs, targets, weights = self.masked(jax.random.fold_in(rng, _MASKING_STREAM), batch["inputs"])
        args = (inputs, batch.get("inputs_segment_ids"), batch.get("inputs_positions"))
        outputs = _apply(model, params, args, {}, deterministic, rng, project)
        return outputs, targets, weights

    def evaluation_batches(self, batches: list[dict[str, np.ndarray]], more: str = MORE) -> list[dict[str, np.ndarray]]:
        """Each batch with its masking drawn once, per example: an example's masking depends on
        `seed` and its tokens alone, not on the row or batch it was packed into, so that every
        evaluation, at every data.eval_batch_size, scores the same positions. `more`: as the base class's."""
        spans = [(batch, *span) for batch in batches for span in _example_spans(batch)]
        examples = np.zeros((len(spans), batches[0]["inputs"].shape[1]), np.int32)  # [N, S], each from position 0
        for number, (batch, row, start, end) in enumerate(spans):
            examples[number, : end - start] = batch["inputs"][row, start:end]
        # A digest of each example's tokens picks its key: identical sentences are masked alike.
        digests = np.array([zlib.crc32(example.astype("<i4").tobytes()) for example in examples], np.uint32)  # [N]
        keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(self.seed), digests)  # [N]
        drawn = jax.device_get(jax.vmap(lambda key, example: self.masked(key, example[None]))(keys, examples))
        if not drawn.weights.any():  # every evaluation would report a loss of 0
            raise DataError(
                f"evaluation: the masking (seed {self.seed}) selects none of the {int((examples != PAD_ID).sum())} "
                f"tokens of the {len(spans)} validation examples; {more}"
            )
        masked = {
            id(batch): {
                "inputs": batch["inputs"].copy(),
                MASKED_TARGETS: batch["inputs"].copy(),
                MASKED_WEIGHTS: np.zeros(batch["inputs"].shape, np.float32),
            }
            for batch in batches
        }
        for number, (batch, row, start, end) in enumerate(spans):
            for key, values in zip(("inputs", MASKED_TARGETS, MASKED_WEIGHTS), drawn):  # values [N, 1, S]
                masked[id(batch)][key][row, start:end] = values[number, 0, : end - start]
        return [{**batch, **masked[id(batch)]} for batch in batches]


def _example_spans(batch: Mapping[str, np.ndarray]) -> list[tuple[int, int, int]]:
    """(row, start, end) of each example of a packed batch's "inputs", in order; without segment
    ids, a row's tokens before its padding are one example."""
    tokens = batch["inputs"]  # [B, S]
    segments = batch.get("inputs_segment_ids")
    if segments is None:
        segments = (tokens != PAD_ID).astype(np.int32)  # [B, S]
    spans = []
    for row in range(tokens.shape[0]):
        for segment in np.unique(segments[row][segments[row] > 0]):
            (positions,) = np.nonzero(segments[row] == segment)
            spans.append((row, int(positions[0]), int(positions[-1]) + 1))
    return spans


def objective_for(config: TransformerConfig, mask_id: int | None = None, seed: int = 0) -> Objective:
    """The objective of `config.architecture`; a masked LM needs its tokenizer's mask id."""
    if config.architecture == "encoder_only":
        if mask_id is None:
            raise ValueError("a masked-LM objective needs a tokenizer with a mask piece (jaxformer.tokens.MASK_PIECE)")
        return MaskedLanguageModel(mask_id=mask_id, vocab_size=config.vocab_size, seed=seed)
    if config.architecture == "decoder_only":
        return CausalLanguageModel()
    return Translation()


TRANSLATION = Translation()  # the default of the steps' `objective`
