"""Attention masks as pure functions.

A mask is a boolean array broadcastable to [B, N, T, S]: True where query t may attend to
key s. Padding tokens carry `PAD_ID`; packed rows carry segment ids (1, 2, ... per pair,
0 for padding) and tokens attend only within their own segment.

The builders take one row of queries and one of keys per batch row: arrays of two batch sizes, or
of another rank than [B, L], are refused naming both shapes (`check_shapes`), where a batch of 1
would broadcast against B and give every row the first row's padding or segments, without a word.
Shapes are static: the check runs when a function is traced and adds nothing to its program.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxformer.model.shape_checks import check_shapes
from jaxformer.tokens import PAD_ID
from jaxformer.typing import Array, Bool, Int


def token_validity(tokens: Int[Array, "B L"], pad_id: int = PAD_ID) -> Bool[Array, "B L"]:
    """True at real tokens, False at padding."""
    return tokens != pad_id


def pairwise_mask(query_valid: Bool[Array, "B T"], key_valid: Bool[Array, "B S"]) -> Bool[Array, "B 1 T S"]:
    """True where both the query and the key are valid (the padding mask)."""
    check_shapes(query_valid=(query_valid, "B T"), key_valid=(key_valid, "B S"))
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


def causal_mask(length: int) -> Bool[Array, "1 1 T T"]:
    """True where the key position is not after the query position."""
    positions = jnp.arange(length)
    return (positions[:, None] >= positions[None, :])[None, None]


def segment_mask(query_segments: Int[Array, "B T"], key_segments: Int[Array, "B S"]) -> Bool[Array, "B 1 T S"]:
    """True where query and key belong to the same packed segment."""
    check_shapes(query_segments=(query_segments, "B T"), key_segments=(key_segments, "B S"))
    return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def combine_masks(*masks: Bool[Array, ...] | None) -> Bool[Array, ...] | None:
    """Logical AND of the given masks (broadcasting); None entries are ignored."""
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = combined & mask
    return combined


def encoder_self_mask(
    source: Int[Array, "B S"], source_segments: Int[Array, "B S"] | None = None, pad_id: int = PAD_ID
) -> Bool[Array, "B 1 S S"]:
    """Source tokens attend to every real source token of their own segment."""
    check_shapes(source=(source, "B S"), source_segments=(source_segments, "B S"))
    valid = token_validity(source, pad_id)
    same_segment = None if source_segments is None else segment_mask(source_segments, source_segments)
    return combine_masks(pairwise_mask(valid, valid), same_segment)


def decoder_self_mask(
    target: Int[Array, "B T"], target_segments: Int[Array, "B T"] | None = None, pad_id: int = PAD_ID
) -> Bool[Array, "B 1 T T"]:
    """Target tokens attend to real, earlier-or-equal target tokens of their own segment."""
    check_shapes(target=(target, "B T"), target_segments=(target_segments, "B T"))
    valid = token_validity(target, pad_id)
    same_segment = None if target_segments is None else segment_mask(target_segments, target_segments)
    return combine_masks(pairwise_mask(valid, valid), causal_mask(target.shape[1]), same_segment)


def cross_mask(
    target: Int[Array, "B T"],
    source: Int[Array, "B S"],
    target_segments: Int[Array, "B T"] | None = None,
    source_segments: Int[Array, "B S"] | None = None,
    pad_id: int = PAD_ID,
) -> Bool[Array, "B 1 T S"]:
    """Target tokens attend to every real source token of the same packed pair."""
    if (target_segments is None) != (source_segments is None):
        raise ValueError("cross_mask needs segment ids for both source and target, or for neither")
    check_shapes(
        target=(target, "B T"),
        source=(source, "B S"),
        target_segments=(target_segments, "B T"),
        source_segments=(source_segments, "B S"),
    )
    padding = pairwise_mask(token_validity(target, pad_id), token_validity(source, pad_id))
    same_segment = None if target_segments is None else segment_mask(target_segments, source_segments)
    return combine_masks(padding, same_segment)
