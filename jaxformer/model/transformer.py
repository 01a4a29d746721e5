"""The encoder-decoder Transformer (Figure 1) with public `encode`, `decode` and `__call__`.

Inputs are token ids with `PAD_ID` (0) as padding. `target` is the decoder's input
under teacher forcing: `BOS_ID` followed by the reference shifted right by one
(`shift_right`); the logits at position t predict reference token t. Packed rows pass
segment ids (1, 2, ... per pair, 0 at padding) and per-segment positions.

Incremental decoding: `encoder_context(source)` once per batch, `init_cache(...)` from
cache.py, then `decode_step(tokens, cache, context)` once per output token.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.model.cache import DecoderCache, EncoderContext
from jaxformer.model.config import TransformerConfig, check_architecture
from jaxformer.model.decoder import Decoder, EncodedSource
from jaxformer.model.encoder import Encoder
from jaxformer.model.layers import Embed
from jaxformer.model.shape_checks import (
    check_float_states,
    check_integer_ids,
    check_positions,
    check_shapes,
    check_step_rows,
)
from jaxformer.tokens import BOS_ID, PAD_ID
from jaxformer.typing import Array, Float, Int


def shift_right(
    targets: Int[Array, "B T"], segments: Int[Array, "B T"] | None = None, bos_id: int = BOS_ID
) -> Int[Array, "B T"]:
    """Decoder inputs for teacher forcing: each segment's tokens moved one place right,
    `bos_id` at each segment start, padding kept as padding."""
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]  # [B, T]
    if segments is None:
        starts = jnp.zeros_like(targets, dtype=bool).at[:, 0].set(True)
        shifted = jnp.where(starts, bos_id, shifted)
        return jnp.where(targets == PAD_ID, PAD_ID, shifted)
    previous = jnp.pad(segments, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]  # [B, T]
    shifted = jnp.where(segments != previous, bos_id, shifted)
    return jnp.where(segments == 0, PAD_ID, shifted)


def check_pair_shapes(
    source,
    target,
    source_segments,
    target_segments,
    source_positions=None,
    target_positions=None,
    encoded=None,
    d_model: int | None = None,
) -> None:
    """Refuses the source-side arrays [B, S] (`encoded` [B, S, D], D = `d_model` when given) and
    target-side ones [B, T] of other shapes, or of two batch sizes B, which the masks would broadcast,
    rows of no tokens, ids of a float or bool dtype, and concrete positions outside their rows
    (`check_positions`)."""
    check_shapes(
        source=(source, "B S"),
        target=(target, "B T"),
        encoded=(encoded, "B S D" if d_model is None else f"B S {d_model}"),
        source_segments=(source_segments, "B S"),
        target_segments=(target_segments, "B T"),
        source_positions=(source_positions, "B S"),
        target_positions=(target_positions, "B T"),
    )
    check_integer_ids(
        source=source,
        target=target,
        source_segments=source_segments,
        target_segments=target_segments,
        source_positions=source_positions,
        target_positions=target_positions,
    )
    check_positions(source_positions=source_positions, target_positions=target_positions)


class Transformer(nn.Module):
    """The whole model. `config.deterministic`, or the `deterministic` argument, turns dropout off."""

    config: TransformerConfig

    def __post_init__(self):
        check_architecture(self.config, "encoder_decoder", "Transformer")
        super().__post_init__()

    def setup(self):
        config = self.config
        if config.share_embeddings:
            self.shared_embedding = Embed(config)
            source_embedding = target_embedding = self.shared_embedding
        else:
            self.source_embedding = Embed(config, vocab_size=config.encoder_vocab_size)
            self.target_embedding = Embed(config)
            source_embedding, target_embedding = self.source_embedding, self.target_embedding
        self.encoder = Encoder(config, embed=source_embedding)
        self.decoder = Decoder(config, embed=target_embedding)

    def _deterministic(self, deterministic: bool | None) -> bool:
        return self.config.deterministic if deterministic is None else deterministic

    def encode(
        self,
        source: Int[Array, "B S"],
        source_segments: Int[Array, "B S"] | None = None,
        source_positions: Int[Array, "B S"] | None = None,
        deterministic: bool | None = None,
    ) -> Float[Array, "B S D"]:
        """The encoder's output for a batch of source rows."""
        check_shapes(
            source=(source, "B S"), source_segments=(source_segments, "B S"), source_positions=(source_positions, "B S")
        )
        check_integer_ids(source=source, source_segments=source_segments, source_positions=source_positions)
        check_positions(source_positions=source_positions)
        return self.encoder(source, source_segments, source_positions, self._deterministic(deterministic))

    def decode(
        self,
        encoded: Float[Array, "B S D"],
        source: Int[Array, "B S"],
        target: Int[Array, "B T"],
        source_segments: Int[Array, "B S"] | None = None,
        target_segments: Int[Array, "B T"] | None = None,
        target_positions: Int[Array, "B T"] | None = None,
        deterministic: bool | None = None,
    ) -> Float[Array, "B T V"]:
        """Float32 next-token logits for every decoder input position, given the encoder output
        (`source` supplies the cross-attention padding mask)."""
        # D checked too: another width failed in the cross-attention's einsum, naming no argument
        check_pair_shapes(
            source, target, source_segments, target_segments, None, target_positions, encoded, self.config.d_model
        )
        check_float_states(encoded=encoded)
        source_side = EncodedSource(encoded, source, source_segments)
        return self.decoder(target, source_side, target_segments, target_positions, self._deterministic(deterministic))

    def __call__(
        self,
        source: Int[Array, "B S"],
        target: Int[Array, "B T"],
        source_segments: Int[Array, "B S"] | None = None,
        target_segments: Int[Array, "B T"] | None = None,
        source_positions: Int[Array, "B S"] | None = None,
        target_positions: Int[Array, "B T"] | None = None,
        deterministic: bool | None = None,
        project: bool = True,
    ) -> Float[Array, "B T V"]:
        """Float32 logits [B, T, V] for decoder inputs `target` given `source` (with
        `project=False`, the decoder's final hidden states [B, T, D])."""
        check_pair_shapes(source, target, source_segments, target_segments, source_positions, target_positions)
        deterministic = self._deterministic(deterministic)
        encoded = self.encode(source, source_segments, source_positions, deterministic)  # [B, S, D]
        source_side = EncodedSource(encoded, source, source_segments)
        return self.decoder(target, source_side, target_segments, target_positions, deterministic, project=project)

    def hidden_states(self, *args, **kwargs) -> tuple[Array, ...]:
        """The decoder's final hidden states and the output projection [V, D], for the same
        arguments as `__call__`, whose logits are hidden @ projection^T (+ the output bias [V],
        a third element with `config.logits_bias`). For losses that project in chunks (training)."""
        hidden, embedding = self(*args, project=False, **kwargs), self.decoder.output_embedding()
        bias = self.decoder.output_bias()
        return (hidden, embedding) if bias is None else (hidden, embedding, bias)

    def encoder_context(self, source: Int[Array, "B S"]) -> EncoderContext:
        """Runs the encoder (without dropout) and precomputes every decoder layer's
        cross-attention keys and values: the part of decoding done once per batch."""
        encoded = self.encode(source, deterministic=True)  # [B, S, D]
        return self.decoder.context(encoded, source)

    def decode_step(
        self, tokens: Int[Array, "R 1"], cache: DecoderCache, context: EncoderContext
    ) -> tuple[Float[Array, "R V"], DecoderCache]:
        """Float32 logits [R, V] of the token that follows `tokens` (the decoder input at
        position `cache.index`: BOS first), and the updated cache. Row r decodes source
        row r // K, where K = R / B hypotheses per source."""
        check_step_rows(tokens, cache.keys[0], context.source_valid)
        return self.decoder.step(tokens, cache, context)


def unstack_layers(params: Any) -> Any:
    """Parameters of a `scan_layers` model rearranged for the same model without scan:
    `encoder/layers/layer/...` with a leading layer axis becomes `encoder/layer_0/...` and so on."""
    params = dict(params)
    for stack in ("encoder", "decoder"):
        if stack not in params or "layers" not in params[stack]:
            continue
        section = dict(params[stack])
        stacked = section.pop("layers")["layer"]
        count = jax.tree.leaves(stacked)[0].shape[0]
        for index in range(count):
            section[f"layer_{index}"] = jax.tree.map(lambda leaf, index=index: leaf[index], stacked)
        params[stack] = section
    return params


def stack_layers(params: Any) -> Any:
    """The inverse of `unstack_layers`: parameters of a model without scan rearranged for the
    same model with `scan_layers` (`encoder/layer_0/...`, ... stacked on a leading layer axis)."""
    params = dict(params)
    for stack in ("encoder", "decoder"):
        if stack not in params or "layer_0" not in params[stack]:
            continue
        section = dict(params[stack])
        count = sum(name.startswith("layer_") for name in section)
        layers = [section.pop(f"layer_{index}") for index in range(count)]
        section["layers"] = {"layer": jax.tree.map(lambda *leaves: jnp.stack(leaves), *layers)}
        params[stack] = section
    return params
