"""The explicit state of incremental decoding.

`DecoderCache` holds, per decoder layer, the self-attention keys and values of the tokens
decoded so far, and the index of the next position. Its array leaves have the decoded
rows first, so a beam search can repeat and reorder them; the index is a scalar that all
rows share. `EncoderContext` holds what every step reads but never changes: the
cross-attention keys and values of the encoder output, computed once per batch, and the
source padding. It has one row per source sentence and is shared by all beams of that
sentence (decoded row r belongs to source row r // beams).

Keys and values are stored heads-major, [rows, N, length, H]: the layout the attention
matmuls read (batch dimensions B, N first), so a decoding step attends to the cache as it
is instead of transposing every layer's whole cache at every step.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from jaxformer.model.config import TransformerConfig
from jaxformer.typing import Array, Bool, Float, Int


@flax.struct.dataclass
class DecoderCache:
    keys: tuple[Float[Array, "R N L H"], ...]  # one per decoder layer; positions >= index are unused
    values: tuple[Float[Array, "R N L H"], ...]
    index: Int[Array, ""]  # the position the next token is written to

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[2]


@flax.struct.dataclass
class EncoderContext:
    keys: tuple[Float[Array, "B N S H"], ...]  # cross-attention keys, one per decoder layer
    values: tuple[Float[Array, "B N S H"], ...]
    source_valid: Bool[Array, "B S"]  # False at source padding


def init_cache(config: TransformerConfig, rows: int, max_length: int) -> DecoderCache:
    """An empty cache for `rows` decoded sequences of up to `max_length` tokens."""
    shape = (rows, config.num_heads, max_length, config.head_dim)
    zeros = tuple(jnp.zeros(shape, config.dtype) for _ in range(config.num_decoder_layers))
    return DecoderCache(keys=zeros, values=zeros, index=jnp.zeros((), jnp.int32))


def write_step(
    cache_keys: Float[Array, "R N L H"],
    cache_values: Float[Array, "R N L H"],
    key: Float[Array, "R 1 N H"],
    value: Float[Array, "R 1 N H"],
    index: Int[Array, ""],
) -> tuple[Float[Array, "R N L H"], Float[Array, "R N L H"], Bool[Array, "1 1 1 L"]]:
    """Stores one step's key and value at `index`; returns the caches and the mask of the
    positions written so far (0 .. index)."""
    key, value = heads_major(key), heads_major(value)  # [R, N, 1, H]
    cache_keys = jax.lax.dynamic_update_slice_in_dim(cache_keys, key.astype(cache_keys.dtype), index, axis=2)
    cache_values = jax.lax.dynamic_update_slice_in_dim(cache_values, value.astype(cache_values.dtype), index, axis=2)
    written = jnp.arange(cache_keys.shape[2]) <= index  # [L]
    return cache_keys, cache_values, written[None, None, None, :]


def heads_major(x: Float[Array, "B L N H"]) -> Float[Array, "B N L H"]:
    """[B, L, N, H] -> [B, N, L, H], the layout of cached keys and values."""
    return jnp.swapaxes(x, 1, 2)
