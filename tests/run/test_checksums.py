"""The checksum of a checkpoint's arrays (jaxformer/run/checksums.py): the same whatever the
array's sharding, changed by any flipped bit or swapped elements, its accelerator and CPU forms
equal to a plain-integer reference, PRNG keys summed by their bits, and a tree's arrays named by
their paths. Saving and verifying them: test_checkpoint_integrity.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.run.checksums import array_checksums


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "int32", "uint16", "bool"])
def test_checksum_ignores_the_sharding_and_sees_every_bit(dtype):
    rng = np.random.default_rng(0)
    host = (rng.standard_normal((16, 12)) * 50).astype(jnp.dtype(dtype))
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    layouts = [
        host,
        jnp.asarray(host),
        jax.device_put(host, NamedSharding(mesh, PartitionSpec("a", "b"))),
        jax.device_put(host, NamedSharding(mesh, PartitionSpec("b", None))),
    ]
    sums = {array_checksums({"x": layout})["x"] for layout in layouts}
    assert len(sums) == 1
    seen = set(sums)
    bits = host.reshape(-1).view(np.uint8).copy()
    for byte in (0, 7, 100, bits.size - 1):
        for bit in (0, 5):
            flipped = bits.copy()
            flipped[byte] ^= 1 << bit
            value = flipped.view(host.dtype).reshape(host.shape)
            if dtype == "bool":
                value = value.astype(bool)  # a bool's other bits are not values
                if (value == host).all():
                    continue
            checksum = array_checksums({"x": jax.device_put(value, NamedSharding(mesh, PartitionSpec("a", None)))})["x"]
            assert checksum not in seen
            seen.add(checksum)
    # swapped elements are a different array too
    swapped = host.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    if not (swapped == host).all():
        assert array_checksums({"x": swapped})["x"] not in sums


@pytest.mark.parametrize("shape", [(), (7,), (16, 12), (8, 3, 5), (2, 0)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool", "uint32"])
def test_accelerator_and_cpu_forms_of_the_checksum_agree(shape, dtype):
    """Accelerators sum elementwise on device, the host one axis at a time in NumPy: the same numbers."""
    from jaxformer.run.checksums import _elementwise_sums, _host_sums, _host_words

    rng = np.random.default_rng(1)
    host = (rng.standard_normal(shape) * 1e4).astype(jnp.dtype(dtype))
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    sharded = len(shape) >= 1 and shape[0] % 8 == 0
    device = jax.device_put(host, NamedSharding(mesh, PartitionSpec("x") if sharded else PartitionSpec()))
    on_device = np.asarray(_elementwise_sums(device))
    on_host = _host_sums(_host_words(host))
    assert on_host.dtype == np.uint32 and on_host.shape == (2,)
    np.testing.assert_array_equal(on_device, on_host)
    # against Python integers: sum over elements of word * product of the axis factors, mod 2**32
    from jaxformer.run.checksums import _axis_weights, _host_axis_weights

    words = _host_words(host).astype(object)
    factors = [np.asarray(_axis_weights(size, axis)).astype(object) for axis, size in enumerate(words.shape)]
    for axis, size in enumerate(words.shape):
        np.testing.assert_array_equal(_host_axis_weights(size, axis), np.asarray(_axis_weights(size, axis)))
    for k in range(2):
        weight = np.ones(words.shape, object)
        for axis, factor in enumerate(factors):
            weight = weight * factor[:, k].reshape([-1 if a == axis else 1 for a in range(words.ndim)])
        assert int(on_host[k]) == int(np.sum(words * weight)) % 2**32


def test_checksum_of_prng_keys_and_paths():
    tree = {"typed": jax.random.key(1), "raw": jax.random.PRNGKey(1), "list": [jnp.zeros(3), jnp.ones(2, jnp.int32)]}
    sums = array_checksums(tree)
    assert sorted(sums) == ["list/0", "list/1", "raw", "typed"]
    assert sums["typed"] == sums["raw"]  # the same key bits
    assert array_checksums({"typed": jax.random.key(2)})["typed"] != sums["typed"]
