"""Label-smoothed cross-entropy (section 5.4) and token accuracy, as (sum, weight) pairs.

Sums rather than means keep averages right when batches are packed, padded or sharded:
the caller adds sums and weights over batches and devices, then divides once.

The per-token maths lives in one place, `token_terms` (and `logits_gradient`, its closed-form
gradient), used both on whole logits here (evaluation) and chunk by chunk by the fused output
projection of training (output_loss.py).

The [B, T, V] logits are the largest activation of the model, so everything here reads them
in elementwise passes that XLA fuses: the target's logit is picked with an iota comparison
(a fused select + reduce, whose gradient is a fused select) rather than a gather, whose
gradient would be a scatter into a zero [B, T, V] buffer; accuracy compares the target's logit
with the row maximum that log-sum-exp computes anyway, rather than a separate argmax.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.typing import Array, Bool, Float, Int


def target_distribution(vocab_size: int, smoothing: float) -> tuple[float, float]:
    """(probability of the reference token, probability of each other token) in the smoothed
    one-hot target: 1 - smoothing, and smoothing / (V - 1)."""
    return 1.0 - smoothing, smoothing / (vocab_size - 1)


def smoothed_target_entropy(vocab_size: int, smoothing: float) -> float:
    """The entropy of the smoothed one-hot target: the loss of a perfect prediction, subtracted
    so that it scores 0."""
    confidence, low = target_distribution(vocab_size, smoothing)
    entropy = -confidence * math.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy -= (vocab_size - 1) * low * math.log(low)
    return entropy


class TokenTerms(NamedTuple):
    """Per-token results of `token_terms` for logits [..., V]."""

    loss: Float[Array, "*batch"]  # KL(smoothed one-hot || softmax(logits))
    nll: Float[Array, "*batch"]  # -log p(target)
    hit: Float[Array, "*batch"]  # 1.0 where the target has the highest logit (no gradient)
    exp: Float[Array, "*batch V"]  # exp(logits - row max): the softmax's numerator
    total: Float[Array, "*batch"]  # sum of `exp`: the softmax's denominator
    is_target: Bool[Array, "*batch V"]  # the one-hot target
    log_normalizer: Float[Array, "*batch"]  # log-sum-exp(logits): log softmax = logits - this

    def softmax(self) -> Float[Array, "*batch V"]:
        """softmax(logits), from its numerator and denominator (no second exponential)."""
        return self.exp / self.total[..., None]


def token_terms(logits: Float[Array, "*batch V"], targets: Int[Array, "*batch"], smoothing: float) -> TokenTerms:
    """The label-smoothed loss, NLL and accuracy of every token, from float32 logits.

    The smoothed target puts 1 - smoothing on the reference token and smoothing / (V - 1)
    on every other token. The loss is the KL divergence to that target (cross-entropy minus
    the target's own entropy), so a perfect prediction scores 0 whatever the smoothing.
    Computed from log-sum-exp without a [..., V] one-hot of floats; differentiable (through
    `loss` and `nll`) with respect to `logits`.
    """
    vocab_size = logits.shape[-1]
    confidence, low = target_distribution(vocab_size, smoothing)
    row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1))  # [...]
    exp = jnp.exp(logits - row_max[..., None])  # [..., V]
    total = jnp.sum(exp, axis=-1)  # [...]
    log_normalizer = row_max + jnp.log(total)  # [...]
    # logits[..., targets] as a masked sum: no gather, no scatter in the gradient.
    is_target = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1) == targets[..., None]  # [..., V]
    target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)  # [...]
    cross_entropy = -(confidence - low) * (target_logit - log_normalizer)  # [...]
    if low > 0:
        sum_log_prob = jnp.sum(logits, axis=-1) - vocab_size * log_normalizer  # [...]
        cross_entropy = cross_entropy - low * sum_log_prob
    loss = cross_entropy - smoothed_target_entropy(vocab_size, smoothing)
    hit = jax.lax.stop_gradient((target_logit >= row_max).astype(jnp.float32))
    return TokenTerms(loss, log_normalizer - target_logit, hit, exp, total, is_target, log_normalizer)


def weighted_sums(terms: TokenTerms, weights: Float[Array, "*batch"]) -> dict[str, Float[Array, ""]]:
    """`loss_sum`, `nll_sum`, `correct` and `weight`: the per-token terms summed with float32 `weights`."""
    return {
        "loss_sum": jnp.sum(terms.loss * weights),
        "nll_sum": jnp.sum(terms.nll * weights),
        "correct": jnp.sum(terms.hit * weights),
        "weight": jnp.sum(weights),
    }


def logits_gradient(terms: TokenTerms, weights: Float[Array, "*batch"], smoothing: float) -> Float[Array, "*batch V"]:
    """d loss_sum / d logits in closed form: weights * (softmax(logits) - smoothed one-hot)."""
    confidence, low = target_distribution(terms.exp.shape[-1], smoothing)
    return weights[..., None] * (terms.softmax() - low - jnp.where(terms.is_target, confidence - low, 0.0))


def pair_consistency(
    log_probs: Float[Array, "P 2 *tokens V"],
    probs: Float[Array, "P 2 *tokens V"],
) -> tuple[Float[Array, "P *tokens"], Float[Array, "P 2 *tokens V"]]:  # noqa: UP037 (a shape, not a name)
    """R-Drop's consistency term (Liang et al., 2021) for pairs of predictions of the same tokens
    under two dropout draws, p and q (their log-probabilities and probabilities, which the caller
    has from `token_terms`: no second exponential): the symmetric KL divergence
    1/2 (KL(p || q) + KL(q || p)) of each pair, and its gradient with respect to both logits in
    closed form, 1/2 (p * (log p - log q - KL(p || q)) + p - q) for p's and alike for q's."""
    log_p, log_q = log_probs[:, 0], log_probs[:, 1]  # [P, *tokens, V]
    p, q = probs[:, 0], probs[:, 1]
    log_ratio = log_p - log_q
    kl_pq = jnp.sum(p * log_ratio, axis=-1)  # [P, *tokens]
    kl_qp = -jnp.sum(q * log_ratio, axis=-1)
    grad_p = 0.5 * (p * (log_ratio - kl_pq[..., None]) + p - q)
    grad_q = 0.5 * (q * (-log_ratio - kl_qp[..., None]) + q - p)
    return 0.5 * (kl_pq + kl_qp), jnp.stack([grad_p, grad_q], axis=1)


def token_losses(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"], smoothing: float = 0.1
) -> dict[str, Float[Array, ""]]:
    """All the per-token metrics in one pass over the logits, as float32 sums:

    `loss_sum` (label-smoothed cross-entropy, see `token_terms`), `nll_sum` (-log p(target)),
    `correct` (tokens whose target has the highest logit) and `weight`.
    """
    terms = token_terms(logits.astype(jnp.float32), targets, smoothing)
    return weighted_sums(terms, weights.astype(jnp.float32))


def label_smoothed_cross_entropy(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"], smoothing: float = 0.1
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(sum of weighted per-token label-smoothed losses, sum of weights), in float32."""
    metrics = token_losses(logits, targets, weights, smoothing)
    return metrics["loss_sum"], metrics["weight"]


def negative_log_likelihood(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted sum of -log p(target), sum of weights): the unsmoothed loss behind perplexity."""
    metrics = token_losses(logits, targets, weights)
    return metrics["nll_sum"], metrics["weight"]


def token_accuracy(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], weights: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(weighted count of tokens whose target has the highest logit, sum of weights)."""
    metrics = token_losses(logits, targets, weights)
    return metrics["correct"], metrics["weight"]
