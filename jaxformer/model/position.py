"""Sinusoidal positional encoding (Vaswani et al., 2017, section 3.5).

    PE(pos, 2i)     = sin(pos / base^(2i / d))
    PE(pos, 2i + 1) = cos(pos / base^(2i / d))

That is the "interleaved" layout; the "halves" layout (Marian's, fairseq's) holds the same
values with the sines of all frequencies first, then their cosines: PE(pos, i) = sin(...) and
PE(pos, d/2 + i) = cos(...) for i < d/2, a fixed permutation of the interleaved columns.

The table is evaluated once per (length, d, base) in float64 NumPy and rounded to float32:
a float32 angle at position 500 already carries an error of 3e-5, which the table avoids.
Packed rows restart their positions at 0 inside each segment, so every position of a row
of length L is below L and a table of L rows covers it.

A symbolic length (`jax.export` with shape polymorphism) takes the first L rows of the table
of its upper bound, which the export must declare as a constraint (e.g. "S <= 256"): the same
float64-rounded values as a concrete length, not a float32 re-evaluation in the program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.typing import Array, Float, Int

LAYOUTS = ("interleaved", "halves")


def halves_order(d_model: int) -> np.ndarray:
    """The interleaved table's columns in the order of the halves layout:
    `table(layout="halves") == table(layout="interleaved")[:, halves_order(d)]`."""
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


@functools.lru_cache(maxsize=32)
def _cached_table(length: int, d_model: int, base: float, layout: str) -> np.ndarray:
    positions = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
    frequencies = base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # [D/2]
    angles = positions * frequencies  # [L, D/2]
    table = np.empty((length, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    if layout == "halves":
        table = table[:, halves_order(d_model)]
    table = table.astype(np.float32)
    table.setflags(write=False)
    return table


def sinusoidal_table(
    length: int, d_model: int, base: float = 10_000.0, layout: str = "interleaved"
) -> Float[np.ndarray, "L D"]:
    """The encoding of positions 0 .. length-1, as a read-only float32 NumPy array [L, D], its
    columns in `layout` ("interleaved" or "halves"; see the module docstring)."""
    if d_model % 2:
        raise ValueError(f"sinusoidal positional encoding needs an even d_model, got d_model={d_model}")
    if length < 0:
        raise ValueError(f"sinusoidal_table needs length >= 0, got length={length}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown positional layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return _cached_table(int(length), int(d_model), float(base), layout)


def positional_encoding(
    length: int,
    d_model: int,
    positions: Int[Array, "B L"] | None = None,
    base: float = 10_000.0,
    layout: str = "interleaved",
) -> Float[Array, "B L D"]:
    """Positional encodings for a batch of rows of `length` tokens, float32.

    Without `positions` every row counts 0 .. length-1 and the result is [1, L, D]. With
    explicit `positions` [B, L] (packed rows restart at 0 per segment; each value must be
    below `length`) the result is [B, L, D]. A value outside [0, length) reads the table's
    nearest end: the models' entry points refuse concrete ones (shape_checks.check_positions);
    traced ones (jit) cannot be checked.
    """
    if jax.export.is_symbolic_dim(length):
        table = jnp.asarray(sinusoidal_table(_upper_bound(length), d_model, base, layout))[:length]  # [L, D]
    else:
        table = jnp.asarray(sinusoidal_table(length, d_model, base, layout))  # [L, D]
    if positions is None:
        return table[None]  # [1, L, D]
    return jnp.take(table, positions, axis=0, mode="clip")  # [B, L, D]


def segment_positions(segments: Int[Array, "B L"]) -> Int[Array, "B L"]:
    """Each token's position inside its segment, restarting at 0 where the segment id changes, as
    the packing pipeline writes them: what a packed row given segment ids without positions means.
    A row of one segment (then padding) counts 0 .. L-1 as without segments."""
    index = jnp.arange(segments.shape[1])[None]  # [1, L]
    previous = jnp.pad(segments[:, :-1], ((0, 0), (1, 0)), constant_values=-1)  # [B, L]
    starts = jnp.where(segments != previous, index, 0)  # [B, L]: where each segment begins
    return index - jax.lax.cummax(starts, axis=1)  # [B, L]


def _upper_bound(length, limit: int = 1 << 24) -> int:
    """The least n that a symbolic `length` provably never exceeds under its constraints."""

    def provably_at_most(n: int) -> bool:
        try:
            return bool(length <= n)
        except jax.errors.InconclusiveDimensionOperation:
            return False

    high = 1
    while not provably_at_most(high):
        if high >= limit:
            raise ValueError(
                f"the positional encoding of the symbolic length {length} needs an upper bound: "
                f"export with a constraint such as '{length} <= 1024'"
            )
        high *= 2
    low = high // 2  # not provably enough (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if provably_at_most(middle) else (middle, high)
    return high
