import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import (
    budget_rate,
    end_step,
    make_optimizer,
    rsqrt_schedule,
    scale_by_budget_schedule,
    set_end_step,
)


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
    expected = -float(schedule(0, None)) * m_hat / (np.sqrt(v_hat) + 1e-9)
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


def test_section_values_reach_adam_and_the_learning_rate_counts_updates():
    optimizer, learning_rate = make_optimizer(section(warmup_steps=7, learning_rate_scale=2.0, eps=1e-3), d_model=64)
    np.testing.assert_allclose(learning_rate(3, None), rsqrt_schedule(64, 7, 2.0)(3), rtol=1e-7)
    params, grads = {"w": jnp.array([1.0])}, {"w": jnp.array([0.1])}
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    np.testing.assert_allclose(updates["w"], -float(learning_rate(0, None)) * 0.1 / (0.1 + 1e-3), rtol=1e-5)  # eps 1e-3
    _, accumulating_rate = make_optimizer(section(warmup_steps=7, accumulation_steps=3), d_model=64)
    for step in range(9):  # a train step is an update whatever its micro-batches (step.py)
        rate = accumulating_rate(jnp.int32(step), None)
        np.testing.assert_array_equal(rate, rsqrt_schedule(64, 7)(jnp.int32(step)))


def test_budget_schedule_warms_up_to_the_rsqrt_peak_then_decays_linearly_to_its_floor_at_the_end():
    d_model, warmup, end, floor = 64, 10, 50, 0.1
    peak = 2.0 * d_model**-0.5 * warmup**-0.5
    rates = np.asarray([budget_rate(count, end, peak, warmup, floor) for count in range(70)])
    np.testing.assert_allclose(rates[warmup - 1], peak, rtol=1e-6)  # update `warmup` (count warmup - 1)
    np.testing.assert_allclose(rates[warmup - 1], rsqrt_schedule(d_model, warmup, 2.0)(warmup - 1), rtol=1e-6)
    np.testing.assert_allclose(rates[: warmup - 1], peak * np.arange(1, warmup) / warmup, rtol=1e-6)
    np.testing.assert_allclose(rates[end - 1], floor * peak, rtol=1e-6)  # update `end` reaches the floor
    np.testing.assert_allclose(rates[end:], floor * peak, rtol=1e-6)  # and stays there
    decay = rates[warmup - 1 : end]
    np.testing.assert_allclose(np.diff(decay), np.full(len(decay) - 1, -(1 - floor) * peak / (end - warmup)), rtol=1e-4)


def test_budget_schedule_end_lives_in_the_optimizer_state_and_moves_the_rate():
    config = section(schedule="budget", warmup_steps=4, learning_rate_scale=1.0, decay_floor=0.0, clip_norm=0.0)
    optimizer, learning_rate = make_optimizer(config, d_model=16)
    params, grads = {"w": jnp.array([1.0])}, {"w": jnp.array([0.5])}
    state = set_end_step(optimizer.init(params), jnp.float32(20.0))
    assert float(end_step(state)) == 20.0
    for _ in range(6):  # past the warmup
        updates, state = optimizer.update(grads, state, params)
    peak = 16**-0.5 * 4**-0.5
    np.testing.assert_allclose(learning_rate(jnp.int32(6), state), peak * (1 - 3 / 16), rtol=1e-6)
    shorter = set_end_step(state, jnp.float32(8.0))
    np.testing.assert_allclose(learning_rate(jnp.int32(6), shorter), peak * (1 - 3 / 4), rtol=1e-6)
    # The update applies the logged rate: Adam's first step is -rate * g / (|g| + eps).
    state = set_end_step(optimizer.init(params), jnp.float32(20.0))
    updates, _ = optimizer.update(grads, state, params)
    np.testing.assert_allclose(updates["w"], -float(learning_rate(jnp.int32(0), state)), rtol=1e-5)


def _adamw_reference(params, grads_per_step, rates, weight_decay, b1=0.9, b2=0.98, eps=1e-9):
    """Loshchilov and Hutter's AdamW written out in numpy: Adam's bias-corrected step plus
    weight_decay x the parameter, both times the step's rate; biases and scales not decayed."""
    params = {name: np.asarray(value, np.float64) for name, value in params.items()}
    m = {name: np.zeros_like(value) for name, value in params.items()}
    v = {name: np.zeros_like(value) for name, value in params.items()}
    for t, (grads, rate) in enumerate(zip(grads_per_step, rates, strict=True), start=1):
        for name, value in params.items():
            g = np.asarray(grads[name], np.float64)
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g**2
            step = (m[name] / (1 - b1**t)) / (np.sqrt(v[name] / (1 - b2**t)) + eps)
            decay = weight_decay * value if name in ("kernel", "embedding", "query_kernel") else 0.0
            params[name] = value - rate * (step + decay)
    return params


@pytest.mark.parametrize("schedule", ["rsqrt", "budget"])
def test_weight_decay_is_adamw_on_kernels_and_embeddings_only(schedule):
    config = section(schedule=schedule, warmup_steps=3, clip_norm=0.0, weight_decay=0.3)
    optimizer, learning_rate = make_optimizer(config, d_model=16)
    rng = np.random.default_rng(0)
    params = {
        "kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
        "embedding": jnp.asarray(rng.normal(size=(5, 4)), jnp.float32),
        "query_kernel": jnp.asarray(rng.normal(size=(2, 4, 3)), jnp.float32),  # [layers, D, K]: scanned
        "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
        "query_bias": jnp.asarray(rng.normal(size=(2, 3)), jnp.float32),  # [H, K]: a bias all the same
        "scale": jnp.asarray(rng.normal(size=(2, 4)), jnp.float32),  # [layers, D]: a scanned LayerNorm
    }
    grads_per_step = [{name: rng.normal(size=value.shape) for name, value in params.items()} for _ in range(6)]
    state = optimizer.init(params)
    if schedule == "budget":
        state = set_end_step(state, jnp.float32(8.0))
    rates, current = [], params
    for step, grads in enumerate(grads_per_step):
        rates.append(float(learning_rate(jnp.int32(step), state)))
        updates, state = optimizer.update(jax.tree.map(jnp.float32, grads), state, current)
        current = optax.apply_updates(current, updates)
    expected = _adamw_reference(params, grads_per_step, rates, weight_decay=0.3)
    for name in params:
        np.testing.assert_allclose(current[name], expected[name], rtol=2e-5, atol=1e-6, err_msg=name)
    undecayed = _adamw_reference(params, grads_per_step, rates, weight_decay=0.0)
    assert not np.allclose(current["kernel"], undecayed["kernel"], atol=1e-4)  # the decay moved the matrices
    for name in ("bias", "query_bias", "scale"):
        np.testing.assert_allclose(current[name], undecayed[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_no_weight_decay_keeps_the_state_tree_runs_saved_before_the_option_have():
    params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}
    before = {  # the chains make_optimizer built before weight_decay existed
        "rsqrt": optax.chain(
            optax.clip_by_global_norm(1.0), optax.adam(rsqrt_schedule(16, 4000), b1=0.9, b2=0.98, eps=1e-9)
        ),
        "budget": optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.scale_by_adam(b1=0.9, b2=0.98, eps=1e-9),
            scale_by_budget_schedule(1e-3, 4, 0.0, end_step=1.0),
        ),
    }
    for schedule, old in before.items():
        plain, _ = make_optimizer(section(schedule=schedule, weight_decay=0.0), d_model=16)
        assert jax.tree.structure(plain.init(params)) == jax.tree.structure(old.init(params))
        decayed, _ = make_optimizer(section(schedule=schedule, weight_decay=0.1), d_model=16)
        assert jax.tree.structure(decayed.init(params)) != jax.tree.structure(old.init(params))
