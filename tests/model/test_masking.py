import re

import jax
import jaxtyping
import numpy as np
import pytest

from jaxformer.model import masking

T, F = True, False


def test_causal_mask():
    np.testing.assert_array_equal(masking.causal_mask(3)[0, 0], [[T, F, F], [T, T, F], [T, T, T]])


def test_encoder_padding_mask():
    mask = masking.encoder_self_mask(np.array([[5, 6, 0]]))
    assert mask.shape == (1, 1, 3, 3)
    np.testing.assert_array_equal(mask[0, 0], [[T, T, F], [T, T, F], [F, F, F]])


def test_decoder_mask_combines_causal_and_padding():
    mask = masking.decoder_self_mask(np.array([[3, 7, 8, 0]]))
    np.testing.assert_array_equal(mask[0, 0], [[T, F, F, F], [T, T, F, F], [T, T, T, F], [F, F, F, F]])


def test_segment_mask_keeps_packed_pairs_apart():
    tokens = np.array([[5, 6, 7, 8, 0]])
    segments = np.array([[1, 1, 2, 2, 0]])
    np.testing.assert_array_equal(
        masking.encoder_self_mask(tokens, segments)[0, 0],
        [[T, T, F, F, F], [T, T, F, F, F], [F, F, T, T, F], [F, F, T, T, F], [F, F, F, F, F]],
    )
    np.testing.assert_array_equal(
        masking.decoder_self_mask(tokens, segments)[0, 0],
        [[T, F, F, F, F], [T, T, F, F, F], [F, F, T, F, F], [F, F, T, T, F], [F, F, F, F, F]],
    )


def test_cross_mask():
    target = np.array([[3, 9, 3, 0]])
    source = np.array([[5, 6, 7, 0, 0]])
    np.testing.assert_array_equal(
        masking.cross_mask(target, source)[0, 0],
        [[T, T, T, F, F], [T, T, T, F, F], [T, T, T, F, F], [F, F, F, F, F]],
    )
    packed = masking.cross_mask(target, source, np.array([[1, 1, 2, 0]]), np.array([[1, 2, 2, 0, 0]]))
    np.testing.assert_array_equal(packed[0, 0], [[T, F, F, F, F], [T, F, F, F, F], [F, T, T, F, F], [F, F, F, F, F]])


def test_cross_mask_needs_both_segment_arrays():
    with pytest.raises(ValueError, match="both source and target"):
        masking.cross_mask(np.ones((1, 2), int), np.ones((1, 3), int), target_segments=np.ones((1, 2), int))


def test_combine_masks_ignores_none():
    assert masking.combine_masks(None, None) is None
    causal = masking.causal_mask(2)
    np.testing.assert_array_equal(masking.combine_masks(None, causal), causal)


@pytest.fixture
def as_for_a_user(monkeypatch):
    """The test session's jaxtyping checks (tests/conftest.py) would refuse these shapes first; a
    user's call runs without them."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)


def rows(batch, length, rank=2):
    return np.ones((batch, length) if rank == 2 else (batch, length, 1), np.int32)


# A batch of 1 broadcast against B: every row got the first row's padding or segments, without a
# word. Per case: the builder, its arrays' shapes in argument order, and the two the error names.
BATCH_MISMATCHES = {
    "pairwise, query of 1": ("pairwise_mask", [(1, 3), (2, 4)], ("query_valid", "key_valid")),
    "pairwise, keys of 1": ("pairwise_mask", [(2, 3), (1, 4)], ("query_valid", "key_valid")),
    "segment, keys of 1": ("segment_mask", [(2, 3), (1, 4)], ("query_segments", "key_segments")),
    "encoder, segments of 1": ("encoder_self_mask", [(2, 3), (1, 3)], ("source", "source_segments")),
    "decoder, segments of 2": ("decoder_self_mask", [(1, 3), (2, 3)], ("target", "target_segments")),
    "cross, source of 1": ("cross_mask", [(2, 3), (1, 4)], ("target", "source")),
    "cross, source segments of 1": ("cross_mask", [(2, 3), (2, 4), (2, 3), (1, 4)], ("target", "source_segments")),
}


def build(builder, shapes):
    arrays = [rows(*shape[:2], rank=len(shape)) for shape in shapes]
    if builder == "pairwise_mask":
        arrays = [array != 0 for array in arrays]
    return getattr(masking, builder)(*arrays)


@pytest.mark.parametrize("case", BATCH_MISMATCHES, ids=list(BATCH_MISMATCHES))
def test_masks_refuse_arrays_of_two_batch_sizes(case, as_for_a_user):
    builder, shapes, (first, second) = BATCH_MISMATCHES[case]
    first_shape, second_shape = shapes[0], shapes[-1]
    message = f"{first} has shape {first_shape} and {second} has shape {second_shape}: their batch size (B) differs"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build(builder, shapes)


@pytest.mark.parametrize(
    "builder,shapes,refused",
    [
        ("pairwise_mask", [(2, 3), (2, 4, 1)], "key_valid has shape (2, 4, 1): it takes 2 dimensions [B, S]"),
        ("encoder_self_mask", [(2, 3), (2, 3, 1)], "source_segments has shape (2, 3, 1): it takes 2 dimensions [B, S]"),
    ],
)
def test_masks_refuse_arrays_of_another_rank(builder, shapes, refused, as_for_a_user):
    with pytest.raises(ValueError, match=f"^{re.escape(refused)}$"):
        build(builder, shapes)


def test_mask_shapes_are_checked_at_trace_time_only(as_for_a_user):
    """Under jit the check is Python's, on static shapes: traced arrays of one batch size pass."""
    mask = jax.jit(masking.cross_mask)(rows(2, 3), rows(2, 4), rows(2, 3), rows(2, 4))
    assert mask.shape == (2, 1, 3, 4)
    with pytest.raises(ValueError, match=r"their batch size \(B\) differs"):
        jax.jit(masking.cross_mask)(rows(2, 3), rows(1, 4))
