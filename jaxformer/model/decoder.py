"""The decoder: masked self-attention, cross-attention over the encoder output and
feed-forward layers, then the output projection (section 3.1, right of Figure 1)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.model.attention import MultiHeadAttention
from jaxformer.model.config import TransformerConfig
from jaxformer.model.layers import Embed, FeedForward, embed_with_positions, layer_norm, residual, run_layers
from jaxformer.model.masking import cross_mask, decoder_self_mask
from jaxformer.typing import Array, Bool, Float, Int


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention, feed-forward; each with residual + LayerNorm."""

    config: TransformerConfig

    @nn.compact
    def __call__(
        self,
        inputs: Float[Array, "B T D"],
        encoded: Float[Array, "B S D"],
        self_mask: Bool[Array, "B 1 T T"],
        encoder_decoder_mask: Bool[Array, "B 1 T S"],
        deterministic: bool,
    ) -> Float[Array, "B T D"]:
        config = self.config

        def dropout(x):
            return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic)

        self_attention = MultiHeadAttention(config, name="self_attention")
        x = residual(
            inputs, lambda y: self_attention(y, y, self_mask, deterministic),
            layer_norm(config, "self_attention_norm"), dropout, config.normalization,
        )  # [B, T, D]
        cross_attention = MultiHeadAttention(config, name="cross_attention")
        x = residual(
            x, lambda y: cross_attention(y, encoded, encoder_decoder_mask, deterministic),
            layer_norm(config, "cross_attention_norm"), dropout, config.normalization,
        )  # [B, T, D]
        feed_forward = FeedForward(config, name="feed_forward")
        return residual(
            x, lambda y: feed_forward(y, deterministic),
            layer_norm(config, "feed_forward_norm"), dropout, config.normalization,
        )  # [B, T, D]


class Decoder(nn.Module):
    """Embeds the decoder input, runs the decoder layers and returns float32 logits."""

    config: TransformerConfig
    embed: Embed

    @nn.compact
    def __call__(
        self,
        encoded: Float[Array, "B S D"],
        source: Int[Array, "B S"],
        target: Int[Array, "B T"],
        source_segments: Int[Array, "B S"] | None = None,
        target_segments: Int[Array, "B T"] | None = None,
        target_positions: Int[Array, "B T"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B T V"]:
        config = self.config
        y = embed_with_positions(self.embed, target, target_positions, deterministic)  # [B, T, D]
        self_mask = decoder_self_mask(target, target_segments)  # [B, 1, T, T]
        encoder_decoder_mask = cross_mask(target, source, target_segments, source_segments)  # [B, 1, T, S]
        y = run_layers(DecoderLayer, config, config.num_decoder_layers, y, encoded, self_mask, encoder_decoder_mask, deterministic=deterministic)
        if config.normalization == "pre":
            y = layer_norm(config, "final_norm")(y)

        if config.tie_output_embedding:
            return self.embed.attend(y)  # [B, T, V]
        kernel = self.param(
            "logits_kernel",
            nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("embed", "vocab")),
            (config.d_model, config.vocab_size), config.param_dtype,
        )
        return jnp.einsum(
            "BTD,DV->BTV", y, kernel.astype(config.dtype), preferred_element_type=jnp.float32
        )  # [B, T, V]
