"""Label-smoothed cross-entropy (section 5.4) and token accuracy, as (sum, weight) pairs.

Sums rather than means keep averages right when batches are packed, padded or sharded:
the caller adds sums and weights over batches and devices, then divides once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.typing import Array, Float, Int


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
    logits = logits.astype(jnp.float32)
    vocab_size = logits.shape[-1]
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
    target_log_prob = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - log_normalizer  # [B, T]
    sum_log_prob = jnp.sum(logits, axis=-1) - vocab_size * log_normalizer  # [B, T]
    cross_entropy = -(confidence - low) * target_log_prob - low * sum_log_prob  # [B, T]
    entropy = -confidence * jnp.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy = entropy - (vocab_size - 1) * low * jnp.log(low)
    weights = weights.astype(jnp.float32)
    return jnp.sum((cross_entropy - entropy) * weights), jnp.sum(weights)


def token_accuracy(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted count of argmax hits, sum of weights)."""
    weights = weights.astype(jnp.float32)
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return jnp.sum(hits * weights), jnp.sum(weights)


def negative_log_likelihood(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted sum of -log p(target), sum of weights): the unsmoothed loss behind perplexity."""
    logits = logits.astype(jnp.float32)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, T]
    weights = weights.astype(jnp.float32)
    return jnp.sum((jax.nn.logsumexp(logits, axis=-1) - target_logit) * weights), jnp.sum(weights)
