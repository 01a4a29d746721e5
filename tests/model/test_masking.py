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
