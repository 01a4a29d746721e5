"""Pure train and eval steps: `(state, batch) -> (state, metrics)` and `(params, batch) -> metrics`.

A batch is a dict of int32 [B, L] arrays: `inputs`, `targets` (each pair's reference ending
in EOS) and, for packed rows, `inputs_segment_ids`, `inputs_positions`,
`targets_segment_ids`, `targets_positions`. The decoder input is `shift_right(targets)`.
Metrics are sums (see loss.py); the caller adds them up and divides.

`make_train_step` and `make_eval_step` bind the model, the optimizer and the experiment
config's `training` section, leaving the functions of (state or params, batch) to jit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxformer.model.transformer import Transformer, shift_right
from jaxformer.tokens import PAD_ID
from jaxformer.training.loss import token_losses
from jaxformer.training.output_loss import projected_token_losses
from jaxformer.training.state import TrainState

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


def _apply(model: Transformer, params, batch: Batch, deterministic: bool, rng: jax.Array | None, method=None):
    """The model on a batch with teacher forcing: logits [B, T, V], or what `method` returns."""
    targets_segments = batch.get("targets_segment_ids")
    return model.apply(
        {"params": params},
        batch["inputs"],
        shift_right(batch["targets"], targets_segments),
        source_segments=batch.get("inputs_segment_ids"),
        target_segments=targets_segments,
        source_positions=batch.get("inputs_positions"),
        target_positions=batch.get("targets_positions"),
        deterministic=deterministic,
        rngs=None if rng is None else {"dropout": rng},
        method=method,
    )


def _target_weights(batch: Batch) -> jax.Array:
    return (batch["targets"] != PAD_ID).astype(jnp.float32)  # [B, T]


def _source_tokens(batch: Batch) -> jax.Array:
    return jnp.sum(batch["inputs"] != PAD_ID).astype(jnp.float32)


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    label_smoothing: float,
    loss_chunk_tokens: int = 512,
) -> tuple[TrainState, Metrics]:
    """One optimizer step (or micro-step) with teacher forcing, dropout keyed by
    `state.dropout_key()` (fold_in(state.rng, state.step)).

    `learning_rate` maps the train step to its rate, for the metrics (see `make_optimizer`).
    The output projection and the loss run fused, `loss_chunk_tokens` target positions at a
    time (see output_loss.py; <= 0: the whole batch at once): the [B, T, V] logits are never
    stored whole.
    """

    def loss_fn(params):
        hidden, output_embedding = _apply(  # [B, T, D], [V, D]
            model, params, batch, False, state.dropout_key(), Transformer.hidden_states
        )
        metrics = projected_token_losses(
            hidden,
            output_embedding,
            batch["targets"],
            _target_weights(batch),
            label_smoothing,
            loss_chunk_tokens,
            model.config.dtype,
        )
        metrics["source_tokens"] = _source_tokens(batch)
        return metrics["loss_sum"] / jnp.maximum(metrics["weight"], 1.0), metrics

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = learning_rate(state.step)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: Batch, *, model: Transformer, label_smoothing: float) -> Metrics:
    """Summed loss, weight and accuracy over one batch, dropout off."""
    logits = _apply(model, params, batch, deterministic=True, rng=None)  # [B, T, V]
    metrics = token_losses(logits, batch["targets"], _target_weights(batch), label_smoothing)
    metrics["source_tokens"] = _source_tokens(batch)
    return metrics


def make_train_step(
    model: Transformer,
    optimizer: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    training: ml_collections.ConfigDict,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`train_step` with the model, the optimizer and its learning rate (from `make_optimizer`)
    bound, and the label smoothing and loss chunk of the config's `training` section."""
    return functools.partial(
        train_step,
        model=model,
        optimizer=optimizer,
        learning_rate=learning_rate,
        label_smoothing=training.label_smoothing,
        loss_chunk_tokens=training.loss_chunk_tokens,
    )


def make_eval_step(model: Transformer, training: ml_collections.ConfigDict) -> Callable[[object, Batch], Metrics]:
    """`eval_step` with the model and the config's `training.label_smoothing` bound."""
    return functools.partial(eval_step, model=model, label_smoothing=training.label_smoothing)
