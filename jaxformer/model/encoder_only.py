"""An encoder-only model: the translator's encoder with a masked-LM head, and a pooled output.

Embedding, sinusoidal positions and `config.num_encoder_layers` self-attention +
feed-forward layers (the translator's `Encoder`, parameters `encoder/layer_0/...`, so a
checkpoint of this model can initialise a translator's encoder), then the masked-LM head:
dense d_model -> d_model, the config's activation, LayerNorm, and logits against the
embedding (always tied, without an output bias, so that training's chunked projection
hidden @ E^T applies). `config.num_decoder_layers` and `config.tie_output_embedding` are not
read. `pooled` averages the encoder states over the real tokens of each row, for sentence
embeddings or a classifier on top.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.model.config import TransformerConfig, check_architecture
from jaxformer.model.encoder import Encoder
from jaxformer.model.layers import Embed, activation_function, layer_norm
from jaxformer.model.masking import token_validity
from jaxformer.model.shape_checks import check_integer_ids, check_positions, check_shapes
from jaxformer.typing import Array, Bool, Float, Int

# Every method reads a batch of token rows, and for packed rows their segment ids and positions.
Tokens = Int[Array, "B S"]
Packing = Int[Array, "B S"] | None


def masked_mean(states: Float[Array, "B S D"], valid: Bool[Array, "B S"]) -> Float[Array, "B D"]:
    """The mean of each row's states where `valid`, in float32; a row with none is all zeros."""
    weights = valid.astype(jnp.float32)  # [B, S]
    total = jnp.einsum("BSD,BS->BD", states.astype(jnp.float32), weights)  # [B, D]
    count = jnp.sum(weights, axis=1, keepdims=True)  # [B, 1]
    return total / jnp.maximum(count, 1.0)


class MaskedLMHead(nn.Module):
    """LayerNorm(act(x W + b)): the transform before the tied output projection (as BERT's)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, states: Float[Array, "B S D"]) -> Float[Array, "B S D"]:
        config = self.config
        # A [D, D] kernel whose output is the residual width: the input side takes the
        # tensor-parallel name, as the feed-forward's second kernel ("mlp", "embed") does; a
        # kernel may not name "embed" twice.
        dense = nn.Dense(
            config.d_model,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("mlp", "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
            name="dense",
        )
        hidden = activation_function(config.activation)(dense(states))  # [B, S, D]
        return layer_norm(config, "norm")(hidden)


class EncoderOnly(nn.Module):
    """The encoder with a masked-LM head. `config.deterministic`, or the `deterministic`
    argument, turns dropout off. Packed rows pass segment ids and per-segment positions."""

    config: TransformerConfig

    def __post_init__(self):
        check_architecture(self.config, "encoder_only", "EncoderOnly")
        super().__post_init__()

    def setup(self):
        self.embedding = Embed(self.config)
        self.encoder = Encoder(self.config, embed=self.embedding)
        self.mlm_head = MaskedLMHead(self.config)

    def _deterministic(self, deterministic: bool | None) -> bool:
        return self.config.deterministic if deterministic is None else deterministic

    def encode(
        self, tokens: Tokens, segments: Packing = None, positions: Packing = None, deterministic: bool | None = None
    ) -> Float[Array, "B S D"]:
        """The encoder's output: each token's state, from the real tokens of its segment."""
        check_shapes(tokens=(tokens, "B S"), segments=(segments, "B S"), positions=(positions, "B S"))
        check_integer_ids(tokens=tokens, segments=segments, positions=positions)
        check_positions(positions=positions)
        return self.encoder(tokens, segments, positions, self._deterministic(deterministic))

    def __call__(
        self,
        tokens: Tokens,
        segments: Packing = None,
        positions: Packing = None,
        deterministic: bool | None = None,
        project: bool = True,
    ) -> Float[Array, "B S V"] | Float[Array, "B S D"]:
        """Float32 masked-LM logits [B, S, V] at every position; with `project=False`, the head's
        hidden states [B, S, D], whose logits are hidden @ embedding^T."""
        hidden = self.mlm_head(self.encode(tokens, segments, positions, deterministic))  # [B, S, D]
        return self.embedding.attend(hidden) if project else hidden

    def hidden_states(
        self, tokens: Tokens, segments: Packing = None, positions: Packing = None, deterministic: bool | None = None
    ) -> tuple[Float[Array, "B S D"], Float[Array, "V D"]]:
        """The head's hidden states and the output projection [V, D] (the embedding). For losses
        that project in chunks (training)."""
        return self(tokens, segments, positions, deterministic, project=False), self.embedding.embedding

    def pooled(
        self, tokens: Tokens, segments: Packing = None, positions: Packing = None, deterministic: bool | None = None
    ) -> Float[Array, "B D"]:
        """One float32 vector per row: the mean of the encoder states over its real tokens (with
        packed rows, over all of the row's segments: pool unpacked rows). A row of PAD alone is a
        batch's filler (evaluation batches end with such rows, data/pipeline.py's eval_batches; fixed
        batch shapes compile once) and pools to zeros, changing no other row; a sentence's row holds
        at least its EOS, so zeros never stand for one. Mask filler rows out with
        `(tokens != PAD_ID).any(axis=1)`."""
        states = self.encode(tokens, segments, positions, deterministic)  # [B, S, D]
        return masked_mean(states, token_validity(tokens))
