"""Dropout (Srivastava et al., 2014) with its random bits from an unrolled Threefry-2x32.

Why not `jax.random.bernoulli` directly: on CPU jax lowers Threefry-2x32 as a rolled loop of
five blocks, so every mask's words are written to memory and read back once per block (3% of a
`small` and 8% of a `base` train step on 2 cores, `python -m benchmarks.step_options`). Written out as array
arithmetic, the same 20 rounds fuse with the comparison and the select into one pass over the
activations. The masks are bit for bit those of `jax.random.bernoulli`, hence of
`flax.linen.Dropout`, for Threefry keys under `jax_threefry_partitionable` (jax's default), so
training computes exactly what it did before; other keys or settings take `jax.random.bernoulli`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxformer.typing import Array, Bool, Float

# Threefry-2x32's rotation constants, alternating between blocks of four rounds (Salmon et al., 2011).
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)
# jax.random.uniform's float32 in [1, 2): the exponent bits of 1.0 with 23 random mantissa bits.
_ONE_BITS = np.uint32(0x3F800000)
_MANTISSA_SHIFT = np.uint32(32 - 23)


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return lax.shift_left(x, np.uint32(bits)) | lax.shift_right_logical(x, np.uint32(32 - bits))


def threefry2x32(key: jax.Array, count_high: jax.Array, count_low: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32, 20 rounds, of the 64-bit counters (count_high, count_low) under `key`
    (uint32 [2]): two uint32 words per counter, as `jax.random`'s Threefry implementation."""
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _KEY_PARITY)
    x0, x1 = count_high + schedule[0], count_low + schedule[1]
    for block in range(5):
        for rotation in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, rotation) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _threefry_key_words(key: jax.Array) -> jax.Array | None:
    """The uint32 [2] words of a Threefry key (typed or raw), or None for another generator."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key) if str(jax.random.key_impl(key)) == "threefry2x32" else None
    return key if jax.config.jax_default_prng_impl == "threefry2x32" else None


def _flat_index(shape: Sequence[int]) -> jax.Array:
    """uint32 array of `shape` holding each element's row-major position."""
    strides = np.cumprod((1, *shape[:0:-1]))[::-1]  # elements per step along each axis
    index = jnp.zeros(shape, jnp.uint32)
    for axis in range(len(shape)):
        index = index + lax.broadcasted_iota(jnp.uint32, tuple(shape), axis) * np.uint32(strides[axis])
    return index


def keep_mask(key: jax.Array, keep_prob: float, shape: Sequence[int]) -> Bool[Array, ...]:
    """`jax.random.bernoulli(key, keep_prob, shape)`, the same bits, computed so that XLA fuses it."""
    shape = tuple(shape)
    words = _threefry_key_words(key)
    if (
        words is None
        or not jax.config.jax_threefry_partitionable
        or jax.config.jax_enable_x64  # bernoulli then draws float64 from 64 bits
        or math.prod(shape) >= 2**32  # counters past 32 bits: the high word is no longer zero
    ):
        return jax.random.bernoulli(key, keep_prob, shape)
    high, low = threefry2x32(words, jnp.zeros(shape, jnp.uint32), _flat_index(shape))
    bits = high ^ low
    # jax.random.uniform's mapping to [0, 1): the top 23 bits as the mantissa of [1, 2), minus 1.
    uniform = lax.bitcast_convert_type(lax.shift_right_logical(bits, _MANTISSA_SHIFT) | _ONE_BITS, jnp.float32) - 1.0
    return uniform < np.float32(keep_prob)


def dropout(
    inputs: Float[Array, ...], rate: float, key: jax.Array, broadcast_dims: Sequence[int] = ()
) -> Float[Array, ...]:
    """Inverted dropout: each element zeroed with probability `rate`, the rest scaled by
    1 / (1 - rate); the values of `flax.linen.Dropout` with the same key. Along `broadcast_dims`
    one mask bit covers the whole axis (word dropout: (-1,), a token's whole embedding)."""
    if rate == 1.0:  # no division by zero, and no NaN gradient
        return jnp.zeros_like(inputs)
    keep_prob = 1.0 - rate
    mask_shape = list(inputs.shape)
    for axis in broadcast_dims:
        mask_shape[axis] = 1
    mask = jnp.broadcast_to(keep_mask(key, keep_prob, mask_shape), inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


class Dropout(nn.Module):
    """`flax.linen.Dropout` (the same masks from the same "dropout" keys, `broadcast_dims` too)
    over `dropout` above."""

    rate: float
    broadcast_dims: Sequence[int] = ()

    @nn.compact
    def __call__(self, inputs: Float[Array, ...], deterministic: bool) -> Float[Array, ...]:
        if self.rate == 0.0 or deterministic:
            return inputs
        return dropout(inputs, self.rate, self.make_rng("dropout"), self.broadcast_dims)
