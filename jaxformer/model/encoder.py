"""The encoder: a stack of self-attention + feed-forward layers (section 3.1, left of Figure 1)."""

from __future__ import annotations

import flax.linen as nn

from jaxformer.model.attention import MultiHeadAttention
from jaxformer.model.config import TransformerConfig
from jaxformer.model.dropout import Dropout
from jaxformer.model.layers import EmbeddedStack, FeedForward, embed_with_positions, layer_norm, residual
from jaxformer.model.masking import encoder_self_mask
from jaxformer.typing import Array, Bool, Float, Int


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual + LayerNorm."""

    config: TransformerConfig

    @nn.compact
    def __call__(
        self, inputs: Float[Array, "B S D"], mask: Bool[Array, "B 1 S S"], deterministic: bool
    ) -> Float[Array, "B S D"]:
        config = self.config

        def dropout(x):
            return Dropout(config.dropout_rate)(x, deterministic=deterministic)

        attention = MultiHeadAttention(config, name="self_attention")
        x = residual(
            inputs,
            lambda y: attention(y, y, mask, deterministic),
            layer_norm(config, "self_attention_norm"),
            dropout,
            config.normalization,
        )  # [B, S, D]
        feed_forward = FeedForward(config, name="feed_forward")
        return residual(
            x,
            lambda y: feed_forward(y, deterministic),
            layer_norm(config, "feed_forward_norm"),
            dropout,
            config.normalization,
        )  # [B, S, D]


class Encoder(EmbeddedStack):
    """Embeds the source, adds positional encodings and runs the encoder layers."""

    def setup(self):
        config = self.config
        self._build(
            EncoderLayer, config.num_encoder_layers, num_inputs=1, word_dropout_rate=config.source_word_dropout_rate
        )

    def __call__(
        self,
        source: Int[Array, "B S"],
        source_segments: Int[Array, "B S"] | None = None,
        source_positions: Int[Array, "B S"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B S D"]:
        x = embed_with_positions(
            self.embed,
            self.input_dropout,
            source,
            source_positions,
            deterministic,
            word_dropout=self.word_dropout,
            segments=source_segments,
        )  # [B, S, D]
        mask = encoder_self_mask(source, source_segments)  # [B, 1, S, S]
        return self._final(self.stack(x, mask, deterministic=deterministic))
