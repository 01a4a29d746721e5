import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import make_optimizer, rsqrt_schedule


def section(**values):
    """The experiment config's `optimizer` section with `values` changed."""
    config = default_config().optimizer
    config.update(values)
    return config


def test_schedule_is_the_papers_formula():
    schedule = rsqrt_schedule(d_model=512, warmup_steps=4000)
    for step in (1, 100, 3999, 4000, 4001, 20_000, 100_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        np.testing.assert_allclose(schedule(step - 1), expected, rtol=1e-5)  # optax counts from 0
    peak = max(float(schedule(s)) for s in range(0, 8000, 50))
    np.testing.assert_allclose(peak, 512**-0.5 * 4000**-0.5, rtol=2e-3)
    with pytest.raises(ValueError, match="warmup_steps=0"):
        rsqrt_schedule(512, 0)


def test_first_update_is_adam_with_the_papers_betas():
    optimizer, schedule = make_optimizer(section(warmup_steps=10, clip_norm=0.0), d_model=64)
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = {"w": jnp.array([0.5, -0.1, 2.0])}
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    # Adam's first step: m = (1-b1) g, v = (1-b2) g^2, bias-corrected -> g / (|g| + eps).
    g = np.asarray(grads["w"])
    m_hat, v_hat = g, g**2
    expected = -float(schedule(0)) * m_hat / (np.sqrt(v_hat) + 1e-9)
    np.testing.assert_allclose(updates["w"], expected, rtol=1e-5)
    adam_state = optimizer.init(params)[0][0]
    assert isinstance(adam_state, optax.ScaleByAdamState)


def test_gradients_are_clipped_by_global_norm():
    optimizer, _ = make_optimizer(section(warmup_steps=10, clip_norm=1.0), d_model=64)
    params = {"w": jnp.zeros(2)}
    huge = {"w": jnp.array([300.0, 400.0])}
    clip_state = optimizer.init(params)
    clipped, _ = optax.clip_by_global_norm(1.0).update(huge, clip_state[0])
    np.testing.assert_allclose(clipped["w"], [0.6, 0.8], rtol=1e-6)
    assert len(clip_state) == 2  # clip, then Adam


def test_accumulation_equals_one_big_batch():
    def loss(params, x):
        return jnp.mean((x @ params["w"]) ** 2)

    x = jax.random.normal(jax.random.key(0), (8, 3))
    params = {"w": jnp.array([0.3, -0.2, 0.5])}
    big, _ = make_optimizer(section(warmup_steps=5, clip_norm=0.0), d_model=16)
    updates, _ = big.update(jax.grad(loss)(params, x), big.init(params), params)
    expected = optax.apply_updates(params, updates)

    accumulating, _ = make_optimizer(section(warmup_steps=5, clip_norm=0.0, accumulation_steps=2), d_model=16)
    state, current = accumulating.init(params), params
    for half in (x[:4], x[4:]):
        updates, state = accumulating.update(jax.grad(loss)(params, half), state, current)
        current = optax.apply_updates(current, updates)
    np.testing.assert_allclose(current["w"], expected["w"], rtol=1e-5)


def test_section_values_reach_adam_and_the_learning_rate_counts_updates():
    optimizer, learning_rate = make_optimizer(section(warmup_steps=7, learning_rate_scale=2.0, eps=1e-3), d_model=64)
    np.testing.assert_allclose(learning_rate(3), rsqrt_schedule(64, 7, 2.0)(3), rtol=1e-7)
    params, grads = {"w": jnp.array([1.0])}, {"w": jnp.array([0.1])}
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    np.testing.assert_allclose(updates["w"], -float(learning_rate(0)) * 0.1 / (0.1 + 1e-3), rtol=1e-5)  # eps 1e-3
    _, accumulating_rate = make_optimizer(section(warmup_steps=7, accumulation_steps=3), d_model=64)
    for step in range(9):  # train steps count micro-batches: 3 of them share an update's rate
        np.testing.assert_array_equal(accumulating_rate(jnp.int32(step)), rsqrt_schedule(64, 7)(jnp.int32(step // 3)))
