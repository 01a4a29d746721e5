"""The decoder: masked self-attention, cross-attention over the encoder output and
feed-forward layers, then the output projection (section 3.1, right of Figure 1).

Besides the full teacher-forced pass, `Decoder.context` and `Decoder.step` decode one
token at a time against an explicit `DecoderCache` (see cache.py).

`Decoder(..., cross_attention=False)` is the stack of a decoder-only language model: its
layers (`CausalDecoderLayer`) are `DecoderLayer`s without the cross-attention sub-layer,
running the same sub-layer code, so their parameters keep the translator's names.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.model.attention import MultiHeadAttention
from jaxformer.model.cache import (
    DecoderCache,
    EncoderContext,
    LayerCache,
    LayerContext,
    check_room,
    heads_major,
    write_step,
)
from jaxformer.model.config import TransformerConfig
from jaxformer.model.dropout import Dropout
from jaxformer.model.layers import EmbeddedStack, FeedForward, embed_with_positions, layer_norm, residual
from jaxformer.model.masking import cross_mask, decoder_self_mask, token_validity
from jaxformer.typing import Array, Bool, Float, Int


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention, feed-forward; each with residual + LayerNorm."""

    config: TransformerConfig
    # False in CausalDecoderLayer: no cross-attention parameters, and its sub-layer is skipped.
    has_cross_attention: ClassVar[bool] = True

    def setup(self):
        config = self.config
        self.self_attention = MultiHeadAttention(config)
        self.self_attention_norm = layer_norm(config)
        if self.has_cross_attention:
            self.cross_attention = MultiHeadAttention(config)
            self.cross_attention_norm = layer_norm(config)
        self.feed_forward = FeedForward(config)
        self.feed_forward_norm = layer_norm(config)
        self.dropout = Dropout(config.dropout_rate)

    def _sublayers(self, inputs, self_attend, cross_attend, deterministic):
        """The layer's residual blocks around `self_attend`, `cross_attend` (None: no
        cross-attention sub-layer) and the feed-forward network."""
        config = self.config

        def dropout(x):
            return self.dropout(x, deterministic=deterministic)

        x = residual(inputs, self_attend, self.self_attention_norm, dropout, config.normalization)
        if cross_attend is not None:
            x = residual(x, cross_attend, self.cross_attention_norm, dropout, config.normalization)
        return residual(
            x, lambda y: self.feed_forward(y, deterministic), self.feed_forward_norm, dropout, config.normalization
        )

    def __call__(
        self,
        inputs: Float[Array, "B T D"],
        encoded: Float[Array, "B S D"],
        self_mask: Bool[Array, "B 1 T T"],
        encoder_decoder_mask: Bool[Array, "B 1 T S"],
        deterministic: bool,
    ) -> Float[Array, "B T D"]:
        return self._sublayers(
            inputs,
            lambda y: self.self_attention(y, y, self_mask, deterministic),
            lambda y: self.cross_attention(y, encoded, encoder_decoder_mask, deterministic),
            deterministic,
        )  # [B, T, D]

    def cross_key_value(
        self, encoded: Float[Array, "B S D"]
    ) -> tuple[Float[Array, "B S N H"], Float[Array, "B S N H"]]:
        """The cross-attention keys and values of the encoder output, for every decoding step."""
        return self.cross_attention.key_value(encoded)

    def _cached_step(
        self, inputs: Float[Array, "R 1 D"], cache: LayerCache, index: Int[Array, ""], cross_attend
    ) -> tuple[Float[Array, "R 1 D"], LayerCache]:
        """`_sublayers` for one new token per row, self-attending to the cache with the token's
        key and value written at `index`."""
        updated = {}

        def self_attend(y):  # [R, 1, D]
            key, value = self.self_attention.key_value(y)  # [R, 1, N, H]
            updated["cache"], written = write_step(cache, key, value, index)
            keys, values = updated["cache"]
            return self.self_attention.attend(y, keys, values, written, True, heads_major=True)  # [R, 1, D]

        outputs = self._sublayers(inputs, self_attend, cross_attend, True)
        return outputs, updated["cache"]

    def step(
        self, inputs: Float[Array, "R 1 D"], cache: LayerCache, index: Int[Array, ""], context: LayerContext
    ) -> tuple[Float[Array, "R 1 D"], LayerCache]:
        """One new token per row through the layer, its self-attention key and value written at `index`.

        The R = B * K rows are the K hypotheses of each of the B sources, so cross-attention
        folds them into the query axis ([B, K, D]) and reads each source's keys once.
        """
        rows, batch = inputs.shape[0], context.keys.shape[0]

        def cross_attend(y):  # [R, 1, D]
            folded = y.reshape(batch, rows // batch, y.shape[-1])  # [B, K, D]
            mask = context.source_valid[:, None, None, :]  # [B, 1, 1, S]
            attended = self.cross_attention.attend(
                folded, context.keys, context.values, mask, True, heads_major=True
            )  # [B, K, D]
            return attended.reshape(y.shape)  # [R, 1, D]

        return self._cached_step(inputs, cache, index, cross_attend)


class CausalDecoderLayer(DecoderLayer):
    """A decoder layer without cross-attention (decoder-only models): masked self-attention and
    feed-forward through `DecoderLayer`'s own sub-layers, the cross-attention one skipped."""

    has_cross_attention: ClassVar[bool] = False

    def __call__(
        self, inputs: Float[Array, "B T D"], self_mask: Bool[Array, "B 1 T T"], deterministic: bool
    ) -> Float[Array, "B T D"]:
        return self._sublayers(
            inputs, lambda y: self.self_attention(y, y, self_mask, deterministic), None, deterministic
        )  # [B, T, D]

    def step(
        self, inputs: Float[Array, "R 1 D"], cache: LayerCache, index: Int[Array, ""]
    ) -> tuple[Float[Array, "R 1 D"], LayerCache]:
        """One new token per row through the layer, its self-attention key and value written at `index`."""
        return self._cached_step(inputs, cache, index, None)


class EncodedSource(NamedTuple):
    """What the teacher-forced decoder reads from the source side: the encoder's output, and the
    source tokens and segments that give the cross-attention mask."""

    states: Float[Array, "B S D"]
    tokens: Int[Array, "B S"]
    segments: Int[Array, "B S"] | None = None


class Decoder(EmbeddedStack):
    """Embeds the decoder input, runs the decoder layers and returns float32 logits.

    With `cross_attention=False` (a decoder-only model) the layers read no encoder output:
    `__call__` and `step` take no `encoded` / `context`.
    """

    cross_attention: bool = True

    def setup(self):
        config = self.config
        if self.cross_attention:
            self._build(
                DecoderLayer, config.num_decoder_layers, num_inputs=3, word_dropout_rate=config.target_word_dropout_rate
            )
        else:
            self._build(
                CausalDecoderLayer,
                config.num_decoder_layers,
                num_inputs=1,
                word_dropout_rate=config.target_word_dropout_rate,
            )
        if not config.tie_output_embedding:
            self.logits_kernel = self.param(
                "logits_kernel",
                nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("embed", "vocab")),
                (config.d_model, config.vocab_size),
                config.param_dtype,
            )
        if config.logits_bias:
            self.logits_bias = self.param(
                "logits_bias",
                nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                (config.vocab_size,),
                config.param_dtype,
            )

    def _check_source_side(self, given: bool, what: str) -> None:
        """`what` (the encoder's output in some form) is given exactly when the layers cross-attend."""
        if given and not self.cross_attention:
            raise ValueError(f"this decoder has no cross-attention (a decoder-only model) and takes no {what}")
        if not given and self.cross_attention:
            raise ValueError(f"this decoder cross-attends to the encoder output and needs the {what}")

    def _project(self, y: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
        config = self.config
        if config.tie_output_embedding:
            logits = self.embed.attend(y)  # [B, T, V]
        else:
            logits = jnp.einsum(
                "BTD,DV->BTV",
                y.astype(config.matmul_operand_dtype),
                self.logits_kernel.astype(config.matmul_operand_dtype),
                preferred_element_type=jnp.float32,
            )  # [B, T, V]
        bias = self.output_bias()
        return logits if bias is None else logits + bias.astype(jnp.float32)[None, None]

    def _logits(self, y: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
        return self._project(self._final(y))

    def output_embedding(self) -> Float[Array, "V D"]:
        """The output projection as [V, D]: logits = hidden @ output_embedding^T."""
        if self.config.tie_output_embedding:
            return self.embed.embedding
        return self.logits_kernel.T

    def output_bias(self) -> Float[Array, V] | None:
        """The bias added to the logits (`config.logits_bias`), None without one."""
        return self.logits_bias if self.config.logits_bias else None

    def __call__(
        self,
        target: Int[Array, "B T"],
        encoded: EncodedSource | None = None,
        target_segments: Int[Array, "B T"] | None = None,
        target_positions: Int[Array, "B T"] | None = None,
        deterministic: bool = True,
        project: bool = True,
    ) -> Float[Array, "B T V"]:
        """Logits [B, T, V] for the decoder inputs `target` under teacher forcing; with
        `project=False`, the final hidden states [B, T, D] instead. `encoded` is None exactly
        when the decoder has no cross-attention."""
        self._check_source_side(encoded is not None, "encoded source")
        y = embed_with_positions(
            self.embed,
            self.input_dropout,
            target,
            target_positions,
            deterministic,
            word_dropout=self.word_dropout,
            segments=target_segments,
        )  # [B, T, D]
        self_mask = decoder_self_mask(target, target_segments)  # [B, 1, T, T]
        if encoded is None:
            y = self.stack(y, self_mask, deterministic=deterministic)
        else:
            encoder_decoder_mask = cross_mask(target, encoded.tokens, target_segments, encoded.segments)  # [B, 1, T, S]
            y = self.stack(y, encoded.states, self_mask, encoder_decoder_mask, deterministic=deterministic)
        y = self._final(y)  # [B, T, D]
        return self._project(y) if project else y

    def context(self, encoded: Float[Array, "B S D"], source: Int[Array, "B S"]) -> EncoderContext:
        """What every decoding step reads: each layer's cross-attention keys and values."""
        self._check_source_side(True, "encoder output")
        keys, values = zip(*(layer.cross_key_value(encoded) for layer in self.stack.unscanned()))  # [B, S, N, H]
        return EncoderContext(
            keys=tuple(map(heads_major, keys)),
            values=tuple(map(heads_major, values)),
            source_valid=token_validity(source),
        )  # keys and values [B, N, S, H]

    def step(
        self, tokens: Int[Array, "R 1"], cache: DecoderCache, context: EncoderContext | None = None
    ) -> tuple[Float[Array, "R V"], DecoderCache]:
        """Logits for the token after `tokens` (the tokens at position `cache.index`), and the cache
        with their keys and values added. Rows are B sources times K hypotheses, source-major;
        `context` is None exactly when the decoder has no cross-attention."""
        self._check_source_side(context is not None, "encoder context")
        check_room(cache)
        positions = jnp.broadcast_to(cache.index, tokens.shape)  # [R, 1]
        y = embed_with_positions(self.embed, self.input_dropout, tokens, positions, True, table_length=cache.max_length)
        layers = self.stack.unscanned()
        # Each layer's extra step argument: its cross-attention context, or nothing.
        layer_contexts = [()] * len(layers) if context is None else [(each,) for each in context.layers()]
        layer_caches = []
        for layer, layer_cache, layer_context in zip(layers, cache.layers(), layer_contexts, strict=True):
            y, layer_cache = layer.step(y, layer_cache, cache.index, *layer_context)  # [R, 1, D]
            layer_caches.append(layer_cache)
        logits = self._logits(y)[:, 0]  # [R, V]
        return logits, cache.advanced(layer_caches)
