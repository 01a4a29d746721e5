"""A decoder-only causal language model: the translator's decoder without cross-attention.

Embedding, sinusoidal positions, `config.num_decoder_layers` masked self-attention +
feed-forward layers (`CausalDecoderLayer`: the translator's `DecoderLayer` with its
cross-attention sub-layer skipped) and the output projection, tied to the embedding unless
`config.tie_output_embedding` is False. `config.num_encoder_layers` is not read.

The inputs are those of the translator's decoder under teacher forcing: BOS followed by the
text shifted right (`transformer.shift_right`); the logits at position t predict token t of
the text. Packed rows pass segment ids and per-segment positions. The parameter names are
the translator's (`decoder/layer_0/self_attention/...`), so a decoder-only checkpoint can
initialise a translator's decoder, whose cross-attention then starts fresh.

Incremental decoding: `init_cache(config, rows, max_length)` from cache.py, then
`decode_step(tokens, cache)` once per token.
"""

from __future__ import annotations

import flax.linen as nn

from jaxformer.model.cache import DecoderCache
from jaxformer.model.config import TransformerConfig, check_architecture
from jaxformer.model.decoder import Decoder
from jaxformer.model.layers import Embed
from jaxformer.model.shape_checks import check_integer_ids, check_positions, check_shapes, check_step_rows
from jaxformer.typing import Array, Float, Int

# The decoder inputs [B, T], and for packed rows their segment ids and positions.
Inputs = Int[Array, "B T"]
Packing = Int[Array, "B T"] | None


class DecoderOnly(nn.Module):
    """The causal language model. `config.deterministic`, or the `deterministic` argument, turns dropout off."""

    config: TransformerConfig

    def __post_init__(self):
        check_architecture(self.config, "decoder_only", "DecoderOnly")
        super().__post_init__()

    def setup(self):
        self.embedding = Embed(self.config)
        self.decoder = Decoder(self.config, embed=self.embedding, cross_attention=False)

    def _deterministic(self, deterministic: bool | None) -> bool:
        return self.config.deterministic if deterministic is None else deterministic

    def __call__(
        self,
        inputs: Inputs,
        segments: Packing = None,
        positions: Packing = None,
        deterministic: bool | None = None,
        project: bool = True,
    ) -> Float[Array, "B T V"] | Float[Array, "B T D"]:
        """Float32 next-token logits [B, T, V] for the decoder inputs (with `project=False`, the
        final hidden states [B, T, D]). Each token sees the real, earlier tokens of its segment."""
        check_shapes(inputs=(inputs, "B T"), segments=(segments, "B T"), positions=(positions, "B T"))
        check_integer_ids(inputs=inputs, segments=segments, positions=positions)
        check_positions(positions=positions)
        return self.decoder(inputs, None, segments, positions, self._deterministic(deterministic), project=project)

    def hidden_states(
        self, inputs: Inputs, segments: Packing = None, positions: Packing = None, deterministic: bool | None = None
    ) -> tuple[Float[Array, "B T D"], Float[Array, "V D"]]:
        """The final hidden states and the output projection [V, D], whose logits are
        hidden @ projection^T. For losses that project in chunks (training)."""
        return self(inputs, segments, positions, deterministic, project=False), self.decoder.output_embedding()

    def decode_step(self, tokens: Int[Array, "R 1"], cache: DecoderCache) -> tuple[Float[Array, "R V"], DecoderCache]:
        """Float32 logits [R, V] of the token that follows `tokens` (the inputs at position
        `cache.index`: BOS first, or the next prompt token), and the updated cache."""
        check_step_rows(tokens, cache.keys[0])
        return self.decoder.step(tokens, cache)
