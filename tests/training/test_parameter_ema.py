"""The parameters' moving average (parameter_ema.py) against a float64 loop written out by hand,
once per optimizer update, and in the optimizer state of the config's optimizer. In a real run
(checkpointed, resumed exactly, a final-choice candidate): test_budget.py."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.parameter_ema import (
    ema_decay_at,
    parameter_ema,
    restart_parameter_ema,
    with_parameter_ema,
)


def _params():
    return {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "b": {"c": jnp.array([0.25, -0.75, 2.0])}}


def _grads(step: int, params):
    # Gradients that change with the step and the parameters, so the average is not a closed form.
    return jax.tree.map(lambda leaf: jnp.sin(leaf * (step + 1)) + 0.1 * step, params)


def test_the_average_follows_the_definition_with_its_warmup():
    decay, steps = 0.8, 12
    optimizer = with_parameter_ema(optax.sgd(0.1), decay)
    plain = optax.sgd(0.1)
    params, plain_params = _params(), _params()
    state, plain_state = optimizer.init(params), plain.init(plain_params)
    expected = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), params)
    for step in range(steps):
        updates, state = optimizer.update(_grads(step, params), state, params)
        params = optax.apply_updates(params, updates)
        plain_updates, plain_state = plain.update(_grads(step, plain_params), plain_state, plain_params)
        plain_params = optax.apply_updates(plain_params, plain_updates)
        keep = min(decay, (1 + step) / (10 + step))
        expected = jax.tree.map(
            lambda average, new, keep=keep: keep * average + (1 - keep) * np.asarray(new), expected, params
        )
    # The wrapped optimizer's updates are untouched: the parameters follow plain SGD bitwise.
    jax.tree.map(np.testing.assert_array_equal, params, plain_params)
    jax.tree.map(
        lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6), parameter_ema(state), expected
    )
    assert int(state.count) == steps
    # Past the warmup the decay is the configured one; before it, (1 + n) / (10 + n).
    assert float(ema_decay_at(0, decay)) == pytest.approx(0.1)
    assert float(ema_decay_at(1000, decay)) == pytest.approx(decay)
    # The average differs from the parameters (it is not a copy of them).
    assert not np.allclose(parameter_ema(state)["w"], params["w"])


def _optimizer_config(**overrides):
    values = dict(
        schedule="budget",
        learning_rate_scale=1.0,
        warmup_steps=2,
        decay_floor=0.0,
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        clip_norm=1.0,
        accumulation_steps=1,
        ema_decay=0.9,
    )
    return ml_collections.ConfigDict(values | overrides)


def test_off_by_default_and_restarted_at_new_parameters():
    off, _ = make_optimizer(_optimizer_config(ema_decay=0.0), d_model=8)
    assert parameter_ema(off.init(_params())) is None
    jax.tree.map(
        np.testing.assert_array_equal, restart_parameter_ema(off.init(_params()), _params()), off.init(_params())
    )

    on, _ = make_optimizer(_optimizer_config(), d_model=8)
    state = on.init(_params())
    fine_tuned = jax.tree.map(lambda leaf: leaf + 1.0, _params())
    restarted = restart_parameter_ema(state, fine_tuned)
    jax.tree.map(np.testing.assert_array_equal, parameter_ema(restarted), fine_tuned)
    # Only the average changed: the Adam moments and the schedule are the same objects' values.
    jax.tree.map(np.testing.assert_array_equal, restarted.inner, state.inner)


def test_a_decay_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="ema decay 1.0"):
        with_parameter_ema(optax.sgd(0.1), 1.0)
