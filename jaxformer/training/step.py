"""Pure train and eval steps: `(state, batch) -> (state, metrics)` and `(params, batch) -> metrics`.

A batch is a dict of int32 [B, L] arrays: `inputs`, `targets` (each pair's reference ending
in EOS) and, for packed rows, `inputs_segment_ids`, `inputs_positions`,
`targets_segment_ids`, `targets_positions` (a language model's batch has one side). What the
model reads and what the loss scores is the objective's (objectives.py): for translation the
decoder input is `shift_right(targets)`. Metrics are sums (see loss.py); the caller adds them
up and divides.

`make_train_step` and `make_eval_step` bind the model, the optimizer and the experiment
config's `training` section, leaving the functions of (state or params, batch) to jit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxformer.tokens import PAD_ID
from jaxformer.training.loss import token_losses
from jaxformer.training.objectives import TRANSLATION, Objective
from jaxformer.training.optimizer import LearningRate
from jaxformer.training.output_loss import projected_token_losses
from jaxformer.training.state import TrainState

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


def _input_tokens(batch: Batch) -> jax.Array:
    """Non-padding tokens the model reads on the source side (the only side of a language model)."""
    tokens = batch["inputs"] if "inputs" in batch else batch["targets"]
    return jnp.sum(tokens != PAD_ID).astype(jnp.float32)


def micro_batches(batch: Batch, count: int) -> dict[str, jax.Array]:
    """[B, L] -> [count, B / count, L]: micro-batch i holds rows i, i + count, i + 2 count, ...,
    so each keeps its share of every data-parallel shard's rows."""
    return {key: x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1) for key, x in batch.items()}


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    learning_rate: LearningRate,
    label_smoothing: float,
    loss_chunk_tokens: int = 512,
    objective: Objective = TRANSLATION,
    rdrop_alpha: float = 0.0,
    accumulation_steps: int = 1,
) -> tuple[TrainState, Metrics]:
    """One optimizer update with teacher forcing, dropout keyed by `state.dropout_key()`
    (fold_in(state.rng, state.step)).

    `accumulation_steps` k > 1: the batch's rows are taken k micro-batches at a time (`micro_batches`;
    the i-th with dropout key fold_in(state.dropout_key(), i)), their gradients of the loss sum
    added, and the update made once with their sum divided by the whole batch's weight: the
    gradient of one batch, token-weighted, in the activation memory of a k-th of it.

    `rdrop_alpha` > 0: R-Drop (Liang et al., 2021). Every row runs twice, side by side, under
    two dropout draws, and the loss adds alpha times the two predictions' symmetric KL
    divergence (output_loss.py): twice the compute of a step, for the same examples.

    `learning_rate` maps (train step, optimizer state) to its rate, for the metrics (see `make_optimizer`).
    The output projection and the loss run fused, `loss_chunk_tokens` target positions at a
    time (see output_loss.py; <= 0: the whole batch at once): the [B, T, V] logits are never
    stored whole.
    """

    def loss_sum(params, batch, dropout_key):
        # R-Drop's pairs as adjacent rows 2i and 2i + 1: a batch-sharded batch stays local to its shard.
        model_batch = jax.tree.map(lambda x: jnp.repeat(x, 2, axis=0), dict(batch)) if rdrop_alpha > 0 else batch
        outputs, targets, weights = objective.forward(model, params, model_batch, False, dropout_key, project=False)
        # [B, T, D], [V, D], and with config.logits_bias the output bias [V]
        hidden, output_embedding, *output_bias = outputs
        metrics = projected_token_losses(
            hidden,
            output_embedding,
            targets,
            weights,
            label_smoothing,
            loss_chunk_tokens,
            model.config.matmul_operand_dtype,
            bias=output_bias[0] if output_bias else None,
            rdrop_alpha=rdrop_alpha,
        )
        metrics["source_tokens"] = _input_tokens(batch)
        return metrics["loss_sum"], metrics

    if accumulation_steps == 1:

        def mean_loss(params):
            total, metrics = loss_sum(params, batch, state.dropout_key())
            return total / jnp.maximum(metrics["weight"], 1.0), metrics

        grads, metrics = jax.grad(mean_loss, has_aux=True)(state.params)
    else:
        parts = micro_batches(batch, accumulation_steps)
        micro_gradient = jax.grad(loss_sum, has_aux=True)

        def add_micro_batch(sums, index):
            part = jax.tree.map(lambda x: x[index], parts)
            added = micro_gradient(state.params, part, jax.random.fold_in(state.dropout_key(), index))
            return jax.tree.map(jnp.add, sums, added), None

        first = micro_gradient(
            state.params, jax.tree.map(lambda x: x[0], parts), jax.random.fold_in(state.dropout_key(), 0)
        )
        (grad_sums, metrics), _ = jax.lax.scan(add_micro_batch, first, jnp.arange(1, accumulation_steps))
        grads = jax.tree.map(lambda g: g / jnp.maximum(metrics["weight"], 1.0), grad_sums)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = learning_rate(state.step, state.opt_state)  # the rate of this update
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(
    params, batch: Batch, *, model: nn.Module, label_smoothing: float, objective: Objective = TRANSLATION
) -> Metrics:
    """Summed loss, weight and accuracy over one batch, dropout off."""
    logits, targets, weights = objective.forward(model, params, batch, True, None, project=True)  # [B, T, V]
    metrics = token_losses(logits, targets, weights, label_smoothing)
    metrics["source_tokens"] = _input_tokens(batch)
    return metrics


def make_train_step(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    learning_rate: LearningRate,
    training: ml_collections.ConfigDict,
    objective: Objective = TRANSLATION,
    rdrop: bool = True,
    accumulation_steps: int = 1,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`train_step` with the model, its objective, the optimizer and its learning rate (from
    `make_optimizer`) bound, and the label smoothing, loss chunk and R-Drop weight of the config's
    `training` section, taking each batch in `accumulation_steps` micro-batches (the
    `optimizer` section's). `rdrop=False`: the plain step of a config with R-Drop, for the steps
    before it starts (rdrop_start.py)."""
    return functools.partial(
        train_step,
        model=model,
        optimizer=optimizer,
        learning_rate=learning_rate,
        label_smoothing=training.label_smoothing,
        loss_chunk_tokens=training.loss_chunk_tokens,
        objective=objective,
        rdrop_alpha=training.rdrop_alpha if rdrop else 0.0,
        accumulation_steps=accumulation_steps,
    )


def make_run_train_step(
    config: ml_collections.ConfigDict,
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    learning_rate: LearningRate,
    objective: Objective,
    rdrop: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`make_train_step` as an experiment `config` runs it: its `training` section and its
    `optimizer.accumulation_steps` (the training loop's step, and the one the pace times)."""
    return make_train_step(
        model,
        optimizer,
        learning_rate,
        config.training,
        objective,
        rdrop=rdrop,
        accumulation_steps=config.optimizer.accumulation_steps,
    )


def make_eval_step(
    model: nn.Module, training: ml_collections.ConfigDict, objective: Objective = TRANSLATION
) -> Callable[[object, Batch], Metrics]:
    """`eval_step` with the model, its objective and the config's `training.label_smoothing` bound."""
    return functools.partial(eval_step, model=model, label_smoothing=training.label_smoothing, objective=objective)
