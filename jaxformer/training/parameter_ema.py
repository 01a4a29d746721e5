"""An exponential moving average of the parameters (Polyak averaging; fairseq's `--ema-decay`,
`tf.train.ExponentialMovingAverage`), kept in the optimizer state so that checkpoints carry it,
resume restores it exactly, and it is sharded as the parameters are. At a run's end it is one more
candidate of the final choice (final_choice.py).

The average starts at the initial parameters and, as tf.train.ExponentialMovingAverage does with
`num_updates`, uses decay min(decay, (1 + n) / (10 + n)) at update n, so that the first updates
are not outweighed by the random initialisation."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class ParameterEmaState(NamedTuple):
    inner: optax.OptState  # the wrapped optimizer's state
    count: jax.Array  # int32 []: optimizer updates averaged so far
    ema_params: Any  # the average, a tree like the parameters


def ema_decay_at(count: jax.Array, decay: float) -> jax.Array:
    """The decay of update `count` (counted from 0): min(decay, (1 + count) / (10 + count))."""
    count = jnp.asarray(count, jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + count) / (10.0 + count))


def with_parameter_ema(inner: optax.GradientTransformation, decay: float) -> optax.GradientTransformation:
    """`inner`, also keeping ema = d * ema + (1 - d) * new_params after each of its updates, where
    new_params = params + updates and d = ema_decay_at(updates so far, decay)."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"ema decay {decay}: must be in (0, 1)")

    def init_fn(params):
        return ParameterEmaState(inner.init(params), jnp.zeros([], jnp.int32), params)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("with_parameter_ema needs the parameters: call update(updates, state, params)")
        updates, inner_state = inner.update(updates, state.inner, params)
        new_params = optax.apply_updates(params, updates)
        keep = ema_decay_at(state.count, decay)
        # ema + (1 - keep) * (new - ema): no cancellation when ema and new are close.
        ema = jax.tree.map(
            lambda average, new: (average + (1.0 - keep) * (new - average)).astype(average.dtype),
            state.ema_params,
            new_params,
        )
        return updates, ParameterEmaState(inner_state, optax.safe_increment(state.count), ema)

    return optax.GradientTransformation(init_fn, update_fn)


def parameter_ema(opt_state: optax.OptState) -> Any | None:
    """The parameters' moving average in `opt_state`; None when the optimizer keeps none."""
    return optax.tree_utils.tree_get(opt_state, "ema_params")


def restart_parameter_ema(opt_state: optax.OptState, params: Any) -> optax.OptState:
    """`opt_state` with its moving average (if any) restarted at `params` (copies, so that no buffer is
    held twice in the state): for a run that replaces its initial parameters (fine-tuning) before
    its first update."""
    if parameter_ema(opt_state) is None:
        return opt_state
    return optax.tree_utils.tree_set(opt_state, ema_params=jax.tree.map(jnp.copy, params))
