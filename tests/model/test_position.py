import math

import numpy as np
import pytest

from jaxformer.model.position import positional_encoding, sinusoidal_table


def reference_encoding(positions, d_model, base=10000.0):
    """The paper's formula evaluated element by element in float64."""
    positions = np.asarray(positions)
    out = np.zeros(positions.shape + (d_model,), dtype=np.float64)
    for index in np.ndindex(positions.shape):
        pos = float(positions[index])
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            out[index + (2 * i,)] = math.sin(angle)
            out[index + (2 * i + 1,)] = math.cos(angle)
    return out


@pytest.mark.parametrize("length,d_model", [(1, 2), (7, 6), (50, 64), (300, 128), (1024, 16)])
def test_table_matches_formula(length, d_model):
    table = sinusoidal_table(length, d_model)
    assert table.shape == (length, d_model) and table.dtype == np.float32
    np.testing.assert_allclose(table, reference_encoding(np.arange(length), d_model), atol=1e-6, rtol=0)


def test_default_positions_broadcast_over_batch():
    encoding = np.asarray(positional_encoding(9, 10))
    assert encoding.shape == (1, 9, 10)
    np.testing.assert_allclose(encoding[0], reference_encoding(np.arange(9), 10), atol=1e-6, rtol=0)


def test_explicit_packed_positions_restart_per_segment():
    # Two rows of length 7: the first packs pairs of 3, 2 and 1 tokens, then padding.
    positions = np.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 4, 5, 6]])
    encoding = np.asarray(positional_encoding(7, 32, positions))
    assert encoding.shape == (2, 7, 32)
    np.testing.assert_allclose(encoding, reference_encoding(positions, 32), atol=1e-6, rtol=0)
    # A packed segment's first token gets the same encoding as a sentence start.
    np.testing.assert_array_equal(encoding[0, 3], encoding[1, 0])


def test_base_is_a_parameter():
    encoding = sinusoidal_table(20, 8, base=100.0)
    np.testing.assert_allclose(encoding, reference_encoding(np.arange(20), 8, base=100.0), atol=1e-6, rtol=0)
    assert not np.allclose(encoding, sinusoidal_table(20, 8))


def test_odd_width_is_an_error():
    with pytest.raises(ValueError, match="even d_model, got d_model=7"):
        sinusoidal_table(4, 7)


def test_halves_layout_is_sines_then_cosines_of_the_interleaved_table():
    from jaxformer.model.position import halves_order

    interleaved, halves = sinusoidal_table(40, 12), sinusoidal_table(40, 12, layout="halves")
    np.testing.assert_array_equal(halves, interleaved[:, halves_order(12)])
    np.testing.assert_array_equal(halves[:, :6], interleaved[:, 0::2])  # sin of every frequency
    np.testing.assert_array_equal(halves[:, 6:], interleaved[:, 1::2])  # then their cosines
    np.testing.assert_array_equal(positional_encoding(40, 12, layout="halves")[0], halves)
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_table(4, 8, layout="stacked")
