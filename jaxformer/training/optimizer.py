"""The paper's optimizer (section 5.3): Adam(0.9, 0.98, 1e-9) with warmup then inverse square root
decay, plus global-norm gradient clipping and optional gradient accumulation."""

from __future__ import annotations

import jax.numpy as jnp
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
    d_model: int,
    warmup_steps: int = 4000,
    learning_rate_scale: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    clip_norm: float | None = 1.0,
    accumulation_steps: int = 1,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and its learning-rate schedule (for logging).

    With `accumulation_steps` k > 1 each call sees one micro-batch; gradients are averaged
    and Adam steps once every k calls, so the schedule counts optimizer updates.
    """
    schedule = rsqrt_schedule(d_model, warmup_steps, learning_rate_scale)
    chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    chain.append(optax.adam(schedule, b1=b1, b2=b2, eps=eps))
    optimizer = optax.chain(*chain)
    if accumulation_steps > 1:
        optimizer = optax.MultiSteps(optimizer, every_k_schedule=accumulation_steps)
    return optimizer, schedule
