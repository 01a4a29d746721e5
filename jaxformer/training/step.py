"""Pure train and eval steps: `(state, batch, rng) -> (state, metrics)` and `(params, batch) -> metrics`.

A batch is a dict of int32 [B, L] arrays: `inputs`, `targets` (each pair's reference ending
in EOS) and, for packed rows, `inputs_segment_ids`, `inputs_positions`,
`targets_segment_ids`, `targets_positions`. The decoder input is `shift_right(targets)`.
Metrics are sums (see loss.py); the caller adds them up and divides.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax

from jaxformer.model.transformer import Transformer, shift_right
from jaxformer.tokens import PAD_ID
from jaxformer.training.loss import token_losses
from jaxformer.training.output_loss import projected_token_losses
from jaxformer.training.state import TrainState

Batch = Mapping[str, jax.Array]


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


def _metrics(logits: jax.Array, batch: Batch, label_smoothing: float) -> dict[str, jax.Array]:
    weights = (batch["targets"] != PAD_ID).astype(jnp.float32)  # [B, T]
    metrics = token_losses(logits, batch["targets"], weights, label_smoothing)
    metrics["source_tokens"] = jnp.sum(batch["inputs"] != PAD_ID).astype(jnp.float32)
    return metrics


def train_step(
    state: TrainState,
    batch: Batch,
    rng: jax.Array,
    *,
    model: Transformer,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    label_smoothing: float,
    accumulation_steps: int = 1,
    loss_chunk_tokens: int = 512,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step (or micro-step) with teacher forcing and dropout keyed by `rng`.

    The output projection and the loss run fused, `loss_chunk_tokens` target positions at a
    time (see output_loss.py; <= 0: the whole batch at once): the [B, T, V] logits are never
    stored whole.
    """

    def loss_fn(params):
        hidden, output_embedding = _apply(model, params, batch, False, rng, Transformer.hidden_states)  # [B, T, D], [V, D]
        weights = (batch["targets"] != PAD_ID).astype(jnp.float32)  # [B, T]
        metrics = projected_token_losses(
            hidden, output_embedding, batch["targets"], weights, label_smoothing, loss_chunk_tokens, model.config.dtype
        )
        metrics["source_tokens"] = jnp.sum(batch["inputs"] != PAD_ID).astype(jnp.float32)
        return metrics["loss_sum"] / jnp.maximum(metrics["weight"], 1.0), metrics

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = schedule(state.step // accumulation_steps)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: Batch, *, model: Transformer, label_smoothing: float) -> dict[str, jax.Array]:
    """Summed loss, weight and accuracy over one batch, dropout off."""
    return _metrics(_apply(model, params, batch, deterministic=True, rng=None), batch, label_smoothing)  # logits [B, T, V]
