"""Label-smoothed cross-entropy (section 5.4) and token accuracy, as (sum, weight) pairs.

Sums rather than means keep averages right when batches are packed, padded or sharded:
the caller adds sums and weights over batches and devices, then divides once.

The [B, T, V] logits are the largest activation of the model, so everything here reads them
in elementwise passes that XLA fuses: the target's logit is picked with an iota comparison
(a fused select + reduce, whose gradient is a fused select) rather than a gather, whose
gradient would be a scatter into a zero [B, T, V] buffer; accuracy compares the target's logit
with the row maximum that log-sum-exp computes anyway, rather than a separate argmax.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxformer.typing import Array, Float, Int


def _target_logit(logits: Float[Array, "B T V"], targets: Int[Array, "B T"]) -> Float[Array, "B T"]:
    """logits[b, t, targets[b, t]], as a masked sum (no gather, no scatter in the gradient)."""
    is_target = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1) == targets[..., None]  # [B, T, V]
    return jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)


def _smoothed_cross_entropy(
    logits: Float[Array, "B T V"], target_logit: Float[Array, "B T"], log_normalizer: Float[Array, "B T"],
    smoothing: float,
) -> Float[Array, "B T"]:
    """Per-token KL(smoothed one-hot || softmax(logits))."""
    vocab_size = logits.shape[-1]
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1)
    target_log_prob = target_logit - log_normalizer  # [B, T]
    cross_entropy = -(confidence - low) * target_log_prob  # [B, T]
    if low > 0:
        sum_log_prob = jnp.sum(logits, axis=-1) - vocab_size * log_normalizer  # [B, T]
        cross_entropy = cross_entropy - low * sum_log_prob
    return cross_entropy - smoothed_target_entropy(vocab_size, smoothing)


def smoothed_target_entropy(vocab_size: int, smoothing: float) -> float:
    """The entropy of the smoothed one-hot target: the loss of a perfect prediction, subtracted
    so that it scores 0."""
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1)
    entropy = -confidence * math.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy -= (vocab_size - 1) * low * math.log(low)
    return entropy


def token_losses(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"], smoothing: float = 0.1
) -> dict[str, Float[Array, ""]]:
    """All the per-token training metrics in one pass over the logits, as float32 sums:

    `loss_sum` (label-smoothed cross-entropy, see `label_smoothed_cross_entropy`), `nll_sum`
    (-log p(target)), `correct` (tokens whose target has the highest logit) and `weight`.
    """
    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1))  # [B, T]
    log_normalizer = row_max + jnp.log(jnp.sum(jnp.exp(logits - row_max[..., None]), axis=-1))  # [B, T]
    target_logit = _target_logit(logits, targets)  # [B, T]
    loss = _smoothed_cross_entropy(logits, target_logit, log_normalizer, smoothing)  # [B, T]
    hits = jax.lax.stop_gradient((target_logit >= row_max).astype(jnp.float32))  # [B, T]
    return {
        "loss_sum": jnp.sum(loss * weights),
        "nll_sum": jnp.sum((log_normalizer - target_logit) * weights),
        "correct": jnp.sum(hits * weights),
        "weight": jnp.sum(weights),
    }


def label_smoothed_cross_entropy(
    logits: Float[Array, "B T V"],
    targets: Int[Array, "B T"],
    weights: Float[Array, "B T"],
    smoothing: float = 0.1,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(sum of weighted per-token losses, sum of weights), in float32.

    The smoothed target puts 1 - smoothing on the reference token and smoothing / (V - 1)
    on every other token. The loss is the KL divergence to that target (cross-entropy minus
    the target's own entropy), so a perfect prediction scores 0 whatever the smoothing.
    Computed from log-sum-exp without a [B, T, V] one-hot.
    """
    metrics = token_losses(logits, targets, weights, smoothing)
    return metrics["loss_sum"], metrics["weight"]


def token_accuracy(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted count of tokens whose target has the highest logit, sum of weights)."""
    metrics = token_losses(logits, targets, weights)
    return metrics["correct"], metrics["weight"]


def negative_log_likelihood(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted sum of -log p(target), sum of weights): the unsmoothed loss behind perplexity."""
    metrics = token_losses(logits, targets, weights)
    return metrics["nll_sum"], metrics["weight"]
