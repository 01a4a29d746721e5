"""The paper's optimizer (section 5.3): Adam(0.9, 0.98, 1e-9) with warmup then inverse square root
decay, plus global-norm gradient clipping (gradient accumulation is the train step's: step.py).

`optimizer.weight_decay` > 0 makes it AdamW (Loshchilov and Hutter 2019): the decay is decoupled
from Adam's moments and scaled by the learning rate, as in optax.adamw and torch's AdamW, and
applies to the kernels and embeddings only (`decays`), not to biases or LayerNorm scales.

`optimizer.schedule="budget"` replaces the inverse square root with budgeted training's schedule
(Li, Yumer and Ramanan 2020): the same warmup to the same peak, then a linear decay that reaches its
floor where the run's budget ends. That end lives in the optimizer state (`end_step`), so it is
checkpointed with the run; the training loop sets it from num_train_steps, or re-estimates it
from the measured pace under a wall-clock budget (budget.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxformer.training.parameter_ema import with_parameter_ema

SCHEDULES = ("rsqrt", "budget")
# (train step, optimizer state) -> learning rate, for the metrics.
LearningRate = Callable[[jax.Array, optax.OptState], jax.Array]


def rsqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps={warmup_steps}: must be positive")

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0  # optax counts updates from 0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def budget_rate(count, end_step, peak: float, warmup_steps: int, floor_fraction: float) -> jax.Array:
    """Update `count`'s rate (counted from 0, as optax does): linear warmup to `peak` at update
    `warmup_steps`, then linear decay to `floor_fraction * peak` at update `end_step`, the floor after."""
    step = jnp.asarray(count, jnp.float32) + 1.0
    warmup = jnp.float32(warmup_steps)
    span = jnp.maximum(jnp.asarray(end_step, jnp.float32) - warmup, 1.0)
    progress = jnp.clip((step - warmup) / span, 0.0, 1.0)  # 0 until the peak, 1 at the budget's end
    return peak * jnp.minimum(step / warmup, 1.0 - (1.0 - floor_fraction) * progress)


class BudgetScheduleState(NamedTuple):
    count: jax.Array  # int32: updates so far
    end_step: jax.Array  # float32: the update at which the decay reaches its floor (the budget's end)


def scale_by_budget_schedule(
    peak: float, warmup_steps: int, floor_fraction: float, end_step: float
) -> optax.GradientTransformation:
    """Scales updates by -budget_rate(count, state.end_step, ...), as optax's scale_by_schedule
    does with a schedule; `end_step` is the initial end (set_end_step changes it)."""
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps={warmup_steps}: must be positive")

    def init_fn(params):
        del params
        return BudgetScheduleState(jnp.zeros([], jnp.int32), jnp.asarray(end_step, jnp.float32))

    def update_fn(updates, state, params=None):
        del params
        rate = budget_rate(state.count, state.end_step, peak, warmup_steps, floor_fraction)
        updates = jax.tree.map(lambda update: (-rate * update).astype(update.dtype), updates)
        return updates, BudgetScheduleState(optax.safe_increment(state.count), state.end_step)

    return optax.GradientTransformation(init_fn, update_fn)


def end_step(opt_state: optax.OptState) -> jax.Array | None:
    """The budget schedule's end (in optimizer updates) in `opt_state`; None for other schedules."""
    return optax.tree_utils.tree_get(opt_state, "end_step")


def set_end_step(opt_state: optax.OptState, value: jax.Array) -> optax.OptState:
    """`opt_state` with the budget schedule's end set to `value` (a float32 scalar array)."""
    return optax.tree_utils.tree_set(opt_state, end_step=value)


def decays(params):
    """Which parameters weight decay shrinks, by name: kernels and embeddings (`*kernel`,
    `embedding`), not biases or LayerNorm scales. Not by rank: attention biases are [H, K] and
    scanned layers stack every parameter on a layers axis."""

    def is_weight(path, _):
        name = next((str(entry.key) for entry in reversed(path) if isinstance(entry, jax.tree_util.DictKey)), "")
        return name.endswith("kernel") or name == "embedding"

    return jax.tree_util.tree_map_with_path(is_weight, params)


def make_optimizer(
    config: ml_collections.ConfigDict, d_model: int
) -> tuple[optax.GradientTransformation, LearningRate]:
    """The optimizer an experiment config's `optimizer` section describes (schedule,
    learning_rate_scale, warmup_steps, decay_floor, b1, b2, eps, weight_decay (0: plain Adam),
    clip_norm (0: no clipping), accumulation_steps, ema_decay (0: no moving average of the
    parameters)), and its learning rate as a function of (train step, optimizer state), for logging.

    Every call is one update: `accumulation_steps` is read by the train step (step.py), which
    adds a batch's micro-batch gradients before it calls this once. A budget schedule's end
    starts at update 1 until the training loop sets it.
    """
    weight_decay = config.get("weight_decay", 0.0)
    chain = [optax.clip_by_global_norm(config.clip_norm)] if config.clip_norm else []
    if config.get("schedule", "rsqrt") == "budget":
        peak = config.learning_rate_scale * d_model**-0.5 * config.warmup_steps**-0.5  # the rsqrt schedule's peak
        floor = config.decay_floor
        chain.append(optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps))
        if weight_decay:  # before the schedule, so that the rate scales the decay too (AdamW)
            chain.append(optax.add_decayed_weights(weight_decay, mask=decays))
        chain.append(scale_by_budget_schedule(peak, config.warmup_steps, floor, end_step=1.0))

        def learning_rate(step, opt_state):
            return budget_rate(step, end_step(opt_state), peak, config.warmup_steps, floor)
    else:
        schedule = rsqrt_schedule(d_model, config.warmup_steps, config.learning_rate_scale)
        if weight_decay:
            adam = optax.adamw(schedule, config.b1, config.b2, config.eps, weight_decay=weight_decay, mask=decays)
        else:
            adam = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
        chain.append(adam)

        def learning_rate(step, opt_state):
            del opt_state
            return schedule(step)

    optimizer = optax.chain(*chain)
    if config.get("ema_decay", 0.0):  # averages the parameters after each update
        optimizer = with_parameter_ema(optimizer, config.ema_decay)
    return optimizer, learning_rate
