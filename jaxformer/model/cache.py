"""The explicit state of incremental decoding.

`DecoderCache` holds, per decoder layer, the self-attention keys and values of the tokens
decoded so far, and the index of the next position. Its array leaves have the decoded
rows first, so a beam search can repeat and reorder them; the index is a scalar that all
rows share. `EncoderContext` holds what every step reads but never changes: the
cross-attention keys and values of the encoder output, computed once per batch, and the
source padding. It has one row per source sentence and is shared by all beams of that
sentence (decoded row r belongs to source row r // beams).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from jaxformer.model.config import TransformerConfig
from jaxformer.typing import Array, Bool, Float, Int


@flax.struct.dataclass
class DecoderCache:
    keys: tuple[Float[Array, "R L N H"], ...]  # one per decoder layer; positions >= index are unused
    values: tuple[Float[Array, "R L N H"], ...]
    index: Int[Array, ""]  # the position the next token is written to

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[1]


@flax.struct.dataclass
class EncoderContext:
    keys: tuple[Float[Array, "B S N H"], ...]  # cross-attention keys, one per decoder layer
    values: tuple[Float[Array, "B S N H"], ...]
    source_valid: Bool[Array, "B S"]  # False at source padding


def init_cache(config: TransformerConfig, rows: int, max_length: int) -> DecoderCache:
    """An empty cache for `rows` decoded sequences of up to `max_length` tokens."""
    shape = (rows, max_length, config.num_heads, config.head_dim)
    zeros = tuple(jnp.zeros(shape, config.dtype) for _ in range(config.num_decoder_layers))
    return DecoderCache(keys=zeros, values=zeros, index=jnp.zeros((), jnp.int32))


def write_step(
    cache_keys: Float[Array, "R L N H"],
    cache_values: Float[Array, "R L N H"],
    key: Float[Array, "R 1 N H"],
    value: Float[Array, "R 1 N H"],
    index: Int[Array, ""],
) -> tuple[Float[Array, "R L N H"], Float[Array, "R L N H"], Bool[Array, "1 1 1 L"]]:
    """Stores one step's key and value at `index`; returns the caches and the mask of the
    positions written so far (0 .. index)."""
    cache_keys = jax.lax.dynamic_update_slice_in_dim(cache_keys, key.astype(cache_keys.dtype), index, axis=1)
    cache_values = jax.lax.dynamic_update_slice_in_dim(cache_values, value.astype(cache_values.dtype), index, axis=1)
    written = jnp.arange(cache_keys.shape[1]) <= index  # [L]
    return cache_keys, cache_values, written[None, None, None, :]
