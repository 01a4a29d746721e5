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
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

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


@dataclasses.dataclass(frozen=True)
class Objective:
    """An architecture's objective. `forward` gives (logits [B, L, V], or (hidden [B, L, D],
    output embedding [V, D]) without `project`; targets [B, L]; float32 weights [B, L]); dropout
    (and masking) keyed by `rng`, None when deterministic."""

    features: ClassVar[tuple[str, ...]]  # the packed features it reads: "inputs" and/or "targets"

    def forward(self, model: nn.Module, params: Any, batch: Batch, deterministic: bool, rng, project: bool):
        raise NotImplementedError

    def evaluation_batches(self, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The evaluation batches as `forward` reads them (drawn once for the whole run)."""
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

    def evaluation_batches(self, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Each batch with its masking drawn once (from `seed` and its index), so that every
        evaluation scores the same positions."""
        masked_batches = []
        for index, batch in enumerate(batches):
            rng = jax.random.fold_in(jax.random.key(self.seed), index)
            inputs, targets, weights = jax.device_get(self.masked(rng, jnp.asarray(batch["inputs"])))
            masked_batches.append({**batch, "inputs": inputs, MASKED_TARGETS: targets, MASKED_WEIGHTS: weights})
        return masked_batches


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
