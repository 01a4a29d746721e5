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

from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.model.config import TransformerConfig
from jaxformer.typing import Array, Bool, Float, Int


class LayerCache(NamedTuple):
    """One decoder layer's self-attention keys and values of the tokens decoded so far."""

    keys: Float[Array, "R N L H"]  # positions >= the cache's index are unused
    values: Float[Array, "R N L H"]


class LayerContext(NamedTuple):
    """What one decoder layer's cross-attention reads at every step."""

    keys: Float[Array, "B N S H"]
    values: Float[Array, "B N S H"]
    source_valid: Bool[Array, "B S"]  # False at source padding


@flax.struct.dataclass
class DecoderCache:
    keys: tuple[Float[Array, "R N L H"], ...]  # one per decoder layer; positions >= index are unused
    values: tuple[Float[Array, "R N L H"], ...]
    index: Int[Array, ""]  # the position the next token is written to

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[2]

    def layers(self) -> list[LayerCache]:
        return [LayerCache(keys, values) for keys, values in zip(self.keys, self.values, strict=True)]

    def grown(self, max_length: int) -> DecoderCache:
        """The same cache with room for `max_length` tokens (unused positions zero); a length of
        another kind than an integer is refused as init_cache refuses it, where jnp.pad named none."""
        check_cache_size("grown", "max_length", max_length, 1)
        extra = max_length - self.max_length
        if extra < 0:
            raise ValueError(f"a cache of {self.max_length} positions cannot shrink to {max_length}")

        def padded(leaf: Float[Array, "R N L H"]) -> Float[Array, "R N _ H"]:
            return jnp.pad(leaf, ((0, 0), (0, 0), (0, extra), (0, 0)))

        return DecoderCache(tuple(map(padded, self.keys)), tuple(map(padded, self.values)), self.index)

    def advanced(self, layers: list[LayerCache]) -> DecoderCache:
        """The cache holding `layers` (the step's updated layer caches), its index one further."""
        return DecoderCache(
            keys=tuple(layer.keys for layer in layers),
            values=tuple(layer.values for layer in layers),
            index=self.index + 1,
        )


@flax.struct.dataclass
class EncoderContext:
    keys: tuple[Float[Array, "B N S H"], ...]  # cross-attention keys, one per decoder layer
    values: tuple[Float[Array, "B N S H"], ...]
    source_valid: Bool[Array, "B S"]  # False at source padding

    def layers(self) -> list[LayerContext]:
        return [LayerContext(k, v, self.source_valid) for k, v in zip(self.keys, self.values, strict=True)]


def init_cache(config: TransformerConfig, rows: int, max_length: int) -> DecoderCache:
    """An empty cache for `rows` decoded sequences of up to `max_length` tokens. Either of another
    kind than an integer, or below its least (0 rows, 1 token), is a one-line ValueError naming it,
    where jax refused the cache's shape naming neither; a jax.export symbolic size passes."""
    check_cache_size("init_cache", "rows", rows, 0)
    check_cache_size("init_cache", "max_length", max_length, 1)
    shape = (rows, config.num_heads, max_length, config.head_dim)
    zeros = tuple(jnp.zeros(shape, config.dtype) for _ in range(config.num_decoder_layers))
    return DecoderCache(keys=zeros, values=zeros, index=jnp.zeros((), jnp.int32))


def check_cache_size(function: str, name: str, value: Any, least: int) -> None:
    """A one-line ValueError naming `function`'s argument `name` unless `value` is an integer >= `least`
    (a bool is not one), or a jax.export symbolic size (an export's traced search)."""
    if jax.export.is_symbolic_dim(value):
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{function}'s {name} must be an integer >= {least}, got {value!r}")


def check_room(cache: DecoderCache) -> None:
    """Refuses a decoding step into a full cache, whose write would land on its last position
    (dynamic_update_slice clamps) and give wrong logits without a word. Only a concrete index is
    checked (eager calls): under jit the index is traced, and the caller sizes the cache."""
    if isinstance(cache.index, jax.core.Tracer):
        return
    index = int(cache.index)
    if index >= cache.max_length:
        raise ValueError(
            f"the cache is full: it holds {cache.max_length} positions and this step writes position {index}; "
            f"make room first with cache.grown(max_length), or init_cache with a larger max_length"
        )


def write_step(
    cache: LayerCache, key: Float[Array, "R 1 N H"], value: Float[Array, "R 1 N H"], index: Int[Array, ""]
) -> tuple[LayerCache, Bool[Array, "1 1 1 L"]]:
    """Stores one step's key and value at `index`; returns the layer's cache and the mask of the
    positions written so far (0 .. index)."""

    def written_at_index(stored: Float[Array, "R N L H"], new: Float[Array, "R 1 N H"]) -> Float[Array, "R N L H"]:
        return jax.lax.dynamic_update_slice_in_dim(stored, heads_major(new).astype(stored.dtype), index, axis=2)

    updated = LayerCache(written_at_index(cache.keys, key), written_at_index(cache.values, value))
    written = jnp.arange(cache.keys.shape[2]) <= index  # [L]
    return updated, written[None, None, None, :]


def heads_major(x: Float[Array, "B L N H"]) -> Float[Array, "B N L H"]:
    """[B, L, N, H] -> [B, N, L, H], the layout of cached keys and values."""
    return jnp.swapaxes(x, 1, 2)
