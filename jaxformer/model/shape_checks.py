"""Refusing arrays whose shapes disagree, at the model's entry points.

The attention masks (masking.py) broadcast: a source of one row with targets of two gives both
targets that one source, and packing arrays of one row give every row the first row's segments,
without a word. The shape annotations ("B S", "B T") are enforced only by the test suite's hook
(tests/conftest.py), so the entry points check here what they document. Shapes are static under
jit: these checks run in Python when a function is traced and add nothing to its program. Sizes
may be jax.export's symbolic dimensions, which compare equal when they are the same expression.
Positions' values (`check_positions`) are checked only where they are concrete: eager calls.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# What a shape letter stands for, in the errors; a letter missing here is named as it is.
DIMENSIONS = {"B": "batch size", "R": "number of rows", "S": "source length", "T": "target length"}
# The letters of a row's length: a row of no tokens failed in the attention's softmax ("zero-size
# array to reduction operation max"), naming no argument. A batch of no rows computes no rows.
LENGTHS = ("S", "T")


def check_shapes(**arrays: tuple[Any, str]) -> None:
    """Refuses arrays, each given as (array, letters) with one letter per dimension ("B S", a
    digit for a fixed size), of another rank than their letters, or whose dimensions of one
    letter differ: a one-line ValueError naming both arrays and their shapes. An array that is
    None (an optional argument not given) is skipped."""
    first: dict[str, tuple[str, tuple, Any]] = {}  # letter -> (name, shape, size) of the first array with it
    for name, (array, letters) in arrays.items():
        if array is None:
            continue
        shape, letters = tuple(np.shape(array)), letters.split()
        if len(shape) != len(letters):
            raise ValueError(f"{name} has shape {shape}: it takes {len(letters)} dimensions [{', '.join(letters)}]")
        for letter, size in zip(letters, shape, strict=True):
            if letter.isdigit() and size != int(letter):
                raise ValueError(f"{name} has shape {shape}: it takes [{', '.join(letters)}]")
            if letter in LENGTHS and size == 0:  # a symbolic size (jax.export) is >= 1: never equal to 0
                raise ValueError(
                    f"{name} has shape {shape}: its {DIMENSIONS[letter]} ({letter}) is 0, "
                    "and a row holds at least one token"
                )
            first_name, first_shape, first_size = first.setdefault(letter, (name, shape, size))
            if size != first_size:
                raise ValueError(
                    f"{first_name} has shape {first_shape} and {name} has shape {shape}: "
                    f"their {DIMENSIONS.get(letter, letter)} ({letter}) differs"
                )


def check_integer_ids(**arrays: Any) -> None:
    """Refuses token ids, segment ids or positions of a dtype other than an integer one: a float
    array failed in jnp.take naming no argument, and a bool one was read as ids 0 and 1 (PAD and
    EOS) without a word. A one-line TypeError naming the array, its shape and dtype; None is skipped."""
    for name, array in arrays.items():
        if array is None:
            continue
        if not hasattr(array, "dtype"):  # a nested list failed in jnp.take, naming no argument
            raise TypeError(
                f"{name} is a {type(array).__name__} (shape {tuple(np.shape(array))}): token ids, segment ids and "
                f"positions are integer arrays: pass jnp.asarray({name})"
            )
        dtype = np.dtype(array.dtype)
        if not np.issubdtype(dtype, np.integer):
            raise TypeError(
                f"{name} has dtype {dtype} (shape {tuple(np.shape(array))}): token ids, segment ids and "
                f"positions are integer arrays"
            )


def check_float_states(**arrays: Any) -> None:
    """Refuses hidden states (the encoder's output `encoded` [B, S, D]) of a dtype other than a
    floating one: integer or bool states were cast in the cross-attention's projections and gave
    other logits without a word (ids given in place of the encoder's output, or its output rounded).
    A one-line TypeError naming the array, its shape and dtype (static: traced arrays are checked
    too); None is skipped."""
    for name, array in arrays.items():
        if array is None:
            continue
        dtype = np.dtype(array.dtype) if hasattr(array, "dtype") else None
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):  # bfloat16 is no numpy floating
            given = f"dtype {dtype}" if dtype is not None else f"a {type(array).__name__}"
            raise TypeError(
                f"{name} has {given} (shape {tuple(np.shape(array))}): it takes the encoder's float states "
                f"[B, S, D] (Transformer.encode's output)"
            )


def check_positions(**arrays: Any) -> None:
    """Refuses concrete positions [B, L] outside [0, L): each indexes its row's sinusoid table of L
    entries, and one past it read the table's nearest end, so a row given positions that continue
    past its length got wrong logits without a word. A one-line ValueError naming the array, the
    value, its row and column. None, traced arrays (inside jax.jit nothing can raise; their values
    are clipped to the table) and arrays another process holds part of are skipped."""
    for name, array in arrays.items():
        if array is None or isinstance(array, jax.core.Tracer):
            continue
        if isinstance(array, jax.Array) and not array.is_fully_addressable:
            continue
        positions = np.asarray(array)
        length = positions.shape[1]
        outside = (positions < 0) | (positions >= length)
        if positions.size == 0 or not outside.any():
            continue
        row, column = np.argwhere(outside)[0]
        raise ValueError(
            f"{name} holds {positions[row, column]} at row {row}, column {column}, outside [0, {length}): a row of "
            f"{length} tokens has the positions 0 .. {length - 1} (packed rows restart at 0 in each segment)"
        )


def check_step_rows(tokens: Any, cache_keys: Any, source_valid: Any = None) -> None:
    """Refuses a decoding step whose `tokens` [R, 1] have another number of rows than the cache
    (`cache_keys`, one layer's [R, N, L, H]), or, with an encoder context (its `source_valid`
    [B, S]), R rows that are not a multiple of the B sources: the rows are each source's K = R / B
    hypotheses, source-major, and read the context as it is (never repeated or broadcast)."""
    check_shapes(tokens=(tokens, "R 1"), cache_keys=(cache_keys, "R N L H"))
    check_integer_ids(tokens=tokens)
    if source_valid is None:
        return
    rows, sources = np.shape(tokens)[0], np.shape(source_valid)[0]
    if (rows if sources == 0 else rows % sources) != 0:
        raise ValueError(
            f"tokens has shape {tuple(np.shape(tokens))} and the encoder context's source has shape "
            f"{tuple(np.shape(source_valid))}: decoded rows are K hypotheses per source, and {rows} "
            f"is not a multiple of {sources}"
        )


def check_mask(mask: Any, scores_shape: tuple) -> None:
    """Refuses an attention mask that would not mean what it says: another rank than the scores'
    [B, N, T, S] (a [B, T, S] mask broadcast as [1, B, T, S], its rows read as heads, without a word
    where B = N), a dimension neither 1 nor the scores' (B, N, T) or not S, or a float dtype (an
    additive mask of 0 and -inf, read as a boolean one: True where it is -inf, the opposite of its
    meaning). A one-line error naming the mask's shape or dtype; None is skipped. Symbolic sizes
    (jax.export) are compared only where both sides are plain integers."""
    if mask is None:
        return
    shape, dtype = tuple(np.shape(mask)), np.dtype(mask.dtype)
    if dtype != np.bool_ and not np.issubdtype(dtype, np.integer):
        raise TypeError(
            f"mask has dtype {dtype} (shape {shape}): a mask is boolean, True where a query may attend to a "
            "key (an additive mask of 0 and -inf would read inverted)"
        )
    sizes = ", ".join(str(size) for size in scores_shape)
    takes = f"[B, N, T, S] = [{sizes}], B, N and T may be 1 (a [T, S] mask: mask[None, None])"
    if len(shape) != 4:
        raise ValueError(f"mask has shape {shape}: it takes 4 dimensions {takes}")
    for index, (size, full) in enumerate(zip(shape, scores_shape)):
        if any(jax.export.is_symbolic_dim(value) for value in (size, full)):
            continue
        if size != full and (index == 3 or size != 1):
            raise ValueError(f"mask has shape {shape}: it takes {takes}")
