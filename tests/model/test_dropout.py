"""The fused dropout against jax.random.bernoulli and flax.linen.Dropout: the same bits."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.dropout import Dropout, dropout, keep_mask, threefry2x32


def test_threefry_matches_the_known_answer_vectors():
    # Salmon et al. (2011), Random123's kat_vectors for threefry2x32_20: key, counter -> output.
    vectors = [
        ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for key, counter, expected in vectors:
        words = threefry2x32(jnp.asarray(key, jnp.uint32), *(jnp.asarray([c], jnp.uint32) for c in counter))
        assert [int(w[0]) for w in words] == list(expected)


@pytest.mark.parametrize("shape", [(), (0, 3), (1,), (7,), (3, 5), (2, 3, 17), (4, 16, 64)])
@pytest.mark.parametrize("keep_prob", [0.9, 0.7, 0.5, 0.001])
def test_keep_mask_is_bernoullis_mask(shape, keep_prob):
    for seed in range(3):
        for key in (jax.random.PRNGKey(seed), jax.random.key(seed)):  # raw and typed keys
            fused = jax.jit(keep_mask, static_argnums=(1, 2))(key, keep_prob, shape)
            np.testing.assert_array_equal(fused, jax.random.bernoulli(key, keep_prob, shape))


def test_other_generators_use_bernoulli_itself():
    key = jax.random.key(5, impl="rbg")
    np.testing.assert_array_equal(keep_mask(key, 0.8, (6, 10)), jax.random.bernoulli(key, 0.8, (6, 10)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rate", [0.1, 0.3, 1.0])
@pytest.mark.parametrize("broadcast_dims", [(), (-1,), (0, 2)])
def test_module_equals_flax_dropout(dtype, rate, broadcast_dims):
    x = jax.random.normal(jax.random.key(1), (4, 9, 16)).astype(dtype)
    rngs = {"dropout": jax.random.PRNGKey(3)}
    ours = Dropout(rate, broadcast_dims).apply({}, x, deterministic=False, rngs=rngs)
    flax_dropout = nn.Dropout(rate, broadcast_dims).apply({}, x, deterministic=False, rngs=rngs)
    assert ours.dtype == flax_dropout.dtype
    np.testing.assert_array_equal(ours, flax_dropout)
    np.testing.assert_array_equal(Dropout(rate, broadcast_dims).apply({}, x, deterministic=True), x)


def test_dropout_rate_and_scale():
    x = jnp.ones((256, 1024))
    dropped = np.asarray(dropout(x, 0.25, jax.random.PRNGKey(0)))
    assert set(np.unique(dropped)) == {0.0, np.float32(1 / 0.75)}
    assert abs((dropped == 0).mean() - 0.25) < 0.005  # 262,144 draws: 5 standard deviations is 0.0043


def test_gradient_flows_through_kept_elements_only():
    x = jnp.arange(1.0, 65.0).reshape(8, 8)
    key = jax.random.PRNGKey(7)
    grad = jax.grad(lambda x: dropout(x, 0.5, key).sum())(x)
    kept = np.asarray(keep_mask(key, 0.5, x.shape))
    np.testing.assert_array_equal(grad, np.where(kept, 2.0, 0.0))


@pytest.mark.slow  # to the slow set (about 12 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_the_model_trains_with_flax_dropouts_masks():
    """The whole translator with every dropout on gives what flax.linen.Dropout gave it: the
    module names, hence the keys, and the masks are the same."""
    from benchmarks.step_options import flax_dropout
    from jaxformer.model.config import preset
    from jaxformer.model.transformer import Transformer

    config = preset("tiny", dropout_rate=0.3, attention_dropout_rate=0.2, activation_dropout_rate=0.2)
    source = jax.random.randint(jax.random.key(0), (2, 7), 4, config.vocab_size)
    target = jax.random.randint(jax.random.key(1), (2, 5), 4, config.vocab_size)
    params = Transformer(config).init(jax.random.key(2), source, target, deterministic=True)["params"]
    rngs = {"dropout": jax.random.PRNGKey(9)}
    ours = Transformer(config).apply({"params": params}, source, target, rngs=rngs)
    with flax_dropout():  # flax.linen.Dropout's modules, jax.random.bernoulli's masks
        with_flax = Transformer(config).apply({"params": params}, source, target, rngs=rngs)
    assert not np.allclose(ours, Transformer(config).apply({"params": params}, source, target, deterministic=True))
    np.testing.assert_array_equal(ours, with_flax)
