"""The safetensors writer and reader: round trips, the bytes of the format, damaged files."""

import json
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.export.safetensors import flatten, read_safetensors, unflatten, write_safetensors
from jaxformer.export.standalone import ExportError


def sample_tensors():
    rng = np.random.default_rng(0)
    return {
        "encoder/layer_0/kernel": rng.standard_normal((3, 5)).astype(np.float32),
        "encoder/layer_0/bias": rng.standard_normal((5,)).astype(jnp.bfloat16),
        "embedding": rng.standard_normal((4, 2)).astype(np.float16),
        "steps": np.arange(6, dtype=np.int32).reshape(2, 3) - 3,
        "big": np.array([2**40, -1], np.int64),
        "mask": np.array([True, False, True]),
        "scalar": np.float64(np.pi),
        "empty": np.zeros((0, 7), np.float32),
    }


def test_round_trip_keeps_values_dtypes_and_shapes(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "params.safetensors"
    write_safetensors(path, tensors, metadata={"format": "test"})
    restored = read_safetensors(path)
    assert list(restored) == list(tensors)
    for name, array in tensors.items():
        assert restored[name].dtype == np.asarray(array).dtype, name
        assert restored[name].shape == np.shape(array), name
        assert restored[name].tobytes() == np.asarray(array).tobytes(), name  # bit for bit


def test_the_bytes_are_the_safetensors_format(tmp_path):
    path = tmp_path / "two.safetensors"
    write_safetensors(path, {"a/x": np.array([1.0, -2.0], np.float32), "b": np.array([1.0], jnp.bfloat16)})
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert length % 8 == 0  # tensors start 8-byte aligned
    header = json.loads(data[8 : 8 + length])
    assert header == {
        "a/x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "BF16", "shape": [1], "data_offsets": [8, 10]},
    }
    body = data[8 + length :]
    # float32 1.0 = 0x3f800000, -2.0 = 0xc0000000; bfloat16 1.0 = 0x3f80; little-endian.
    assert body == bytes.fromhex("0000803f000000c0803f")


def test_flatten_and_unflatten_are_inverse():
    tree = {"decoder": {"layer_0": {"w": np.ones(2)}, "norm": {"scale": np.zeros(3)}}, "embed": np.ones((2, 2))}
    flat = flatten(tree)
    assert sorted(flat) == ["decoder/layer_0/w", "decoder/norm/scale", "embed"]
    again = unflatten(flat, "here")
    assert again.keys() == tree.keys() and again["decoder"]["norm"]["scale"].shape == (3,)
    with pytest.raises(ValueError, match="without '/'"):
        flatten({"a/b": np.ones(1)})
    with pytest.raises(ExportError, match="below another tensor"):
        unflatten({"a": np.ones(1), "a/b": np.ones(1)}, "here")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:5], "fewer than the 8"),
        (lambda data: data[:-3], "data_offsets"),
        (lambda data: struct.pack("<Q", 10**9) + data[8:], "exceeds"),
        (lambda data: data[:8] + b"[" + data[9:], "not JSON"),
        (lambda data: data + b"\0" * 8, "cover"),
    ],
)
def test_damaged_files_are_named(tmp_path, damage, message):
    path = tmp_path / "damaged.safetensors"
    write_safetensors(path, sample_tensors())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ExportError, match=message) as error:
        read_safetensors(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_the_safetensors_package_reads_and_writes_the_same():
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import tempfile

    tensors = {name: value for name, value in sample_tensors().items() if name != "encoder/layer_0/bias"}  # no bf16
    with tempfile.TemporaryDirectory() as directory:
        ours, theirs = f"{directory}/ours.safetensors", f"{directory}/theirs.safetensors"
        write_safetensors(ours, tensors)
        safetensors_numpy.save_file({k: np.asarray(v) for k, v in tensors.items()}, theirs)
        for read in (safetensors_numpy.load_file(ours), read_safetensors(theirs)):
            assert read.keys() == tensors.keys()
            for name, array in tensors.items():
                np.testing.assert_array_equal(read[name], array)
                assert read[name].dtype == np.asarray(array).dtype
        # bfloat16 through the package's JAX reader (numpy has no bfloat16 of its own).
        import safetensors.flax

        everything = {name: value for name, value in sample_tensors().items() if np.asarray(value).itemsize <= 4}
        write_safetensors(ours, everything)  # (JAX without x64 narrows 64-bit types)
        read = safetensors.flax.load_file(ours)
        for name, array in everything.items():
            assert read[name].dtype == np.asarray(array).dtype and read[name].shape == np.shape(array), name
            assert np.asarray(read[name]).tobytes() == np.asarray(array).tobytes(), name
