"""The paper's optimizer (section 5.3): Adam(0.9, 0.98, 1e-9) with warmup then inverse square root
decay, plus global-norm gradient clipping and optional gradient accumulation."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax


def rsqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps={warmup_steps}: must be positive")

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0  # optax counts updates from 0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def make_optimizer(
    config: ml_collections.ConfigDict, d_model: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer an experiment config's `optimizer` section describes (learning_rate_scale,
    warmup_steps, b1, b2, eps, clip_norm (0: no clipping), accumulation_steps), and its learning
    rate as a function of the train step, for logging.

    With `accumulation_steps` k > 1 each call sees one micro-batch; gradients are averaged
    and Adam steps once every k calls, so the schedule counts optimizer updates: train step
    s runs at the rate of update s // k.
    """
    schedule = rsqrt_schedule(d_model, config.warmup_steps, config.learning_rate_scale)
    chain = [optax.clip_by_global_norm(config.clip_norm)] if config.clip_norm else []
    chain.append(optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps))
    optimizer = optax.chain(*chain)
    every = config.accumulation_steps
    if every == 1:
        return optimizer, schedule
    return optax.MultiSteps(optimizer, every_k_schedule=every), lambda step: schedule(step // every)
