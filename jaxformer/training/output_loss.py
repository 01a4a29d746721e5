"""The output projection fused with the label-smoothed loss, in chunks of target positions.

The logits [B, T, V] are the largest tensor of a training step (V ~ 8k to 37k): computing them
whole, keeping them for the backward pass and writing their gradient (once more transposed,
for the embedding's gradient) costs memory traffic that small and medium models feel. Here
the logits of one chunk of target positions at a time are computed, reduced to the loss sums,
and turned at once into their share of the gradients with respect to the decoder's hidden
states and the output embedding; only those gradients are kept for the backward pass. The
gradient of the loss with respect to the logits is the closed form

    d loss / d z = w * (softmax(z) - q),    q = the smoothed one-hot target,

so nothing is recomputed. Chunks split the target length, never the batch, so a
batch-sharded step stays batch-sharded. The same sums as `loss.token_losses` come out.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxformer.training.loss import smoothed_target_entropy
from jaxformer.typing import Array, Float, Int


def chunk_length(batch: int, length: int, chunk_tokens: int) -> int:
    """The largest divisor of `length` whose chunks hold at most `chunk_tokens` tokens
    (batch x chunk length), at least 1; the whole length when `chunk_tokens` <= 0."""
    if chunk_tokens <= 0:
        return length
    best = 1
    for candidate in range(1, length + 1):
        if length % candidate == 0 and batch * candidate <= chunk_tokens:
            best = candidate
    return best


def _chunk(hidden, embedding, targets, weights, smoothing: float, compute_dtype):
    """Sums and gradients for one chunk: hidden [B, t, D], targets and weights [B, t]."""
    vocab_size = embedding.shape[0]
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1)
    logits = jnp.einsum(
        "BTD,VD->BTV", hidden.astype(compute_dtype), embedding.astype(compute_dtype),
        preferred_element_type=jnp.float32,
    )  # [B, t, V]
    row_max = jnp.max(logits, axis=-1)  # [B, t]
    exp = jnp.exp(logits - row_max[..., None])  # [B, t, V]
    total = jnp.sum(exp, axis=-1)  # [B, t]
    log_normalizer = row_max + jnp.log(total)  # [B, t]
    is_target = jax.lax.broadcasted_iota(targets.dtype, logits.shape, 2) == targets[..., None]  # [B, t, V]
    target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)  # [B, t]
    cross_entropy = -(confidence - low) * (target_logit - log_normalizer)
    if low > 0:
        cross_entropy = cross_entropy - low * (jnp.sum(logits, axis=-1) - vocab_size * log_normalizer)
    loss = cross_entropy - smoothed_target_entropy(vocab_size, smoothing)  # [B, t]
    sums = jnp.stack([
        jnp.sum(loss * weights),
        jnp.sum((log_normalizer - target_logit) * weights),
        jnp.sum((target_logit >= row_max).astype(jnp.float32) * weights),
    ])  # [3]: loss, nll, correct
    softmax = exp / total[..., None]  # [B, t, V]
    grad_logits = weights[..., None] * (softmax - low - jnp.where(is_target, confidence - low, 0.0))  # [B, t, V]
    grad_logits = grad_logits.astype(compute_dtype)
    grad_hidden = jnp.einsum(
        "BTV,VD->BTD", grad_logits, embedding.astype(compute_dtype), preferred_element_type=jnp.float32
    )  # [B, t, D]
    grad_embedding = jnp.einsum(
        "BTV,BTD->VD", grad_logits, hidden.astype(compute_dtype), preferred_element_type=jnp.float32
    )  # [V, D]
    return sums, grad_hidden, grad_embedding


def _sums_and_grads(hidden, embedding, targets, weights, smoothing, chunk_tokens, compute_dtype):
    batch, length, d_model = hidden.shape
    chunk = chunk_length(batch, length, chunk_tokens)
    num_chunks = length // chunk
    if num_chunks == 1:
        sums, grad_hidden, grad_embedding = _chunk(hidden, embedding, targets, weights, smoothing, compute_dtype)
        return sums, grad_hidden, grad_embedding

    def split(x):  # [B, T, ...] -> [C, B, t, ...]
        return jnp.moveaxis(x.reshape(batch, num_chunks, chunk, *x.shape[2:]), 1, 0)

    def body(carry, pieces):
        sums, grad_embedding = carry
        piece_sums, grad_hidden, piece_grad_embedding = _chunk(*pieces[:1], embedding, *pieces[1:], smoothing, compute_dtype)
        return (sums + piece_sums, grad_embedding + piece_grad_embedding), grad_hidden

    initial = (jnp.zeros((3,), jnp.float32), jnp.zeros(embedding.shape, jnp.float32))
    (sums, grad_embedding), grad_hidden = jax.lax.scan(body, initial, (split(hidden), split(targets), split(weights)))
    grad_hidden = jnp.moveaxis(grad_hidden, 0, 1).reshape(batch, length, d_model)  # [B, T, D]
    return sums, grad_hidden, grad_embedding


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused(hidden, embedding, targets, weights, smoothing, chunk_tokens, compute_dtype):
    sums, _, _ = _sums_and_grads(hidden, embedding, targets, weights, smoothing, chunk_tokens, compute_dtype)
    return sums


def _fused_forward(hidden, embedding, targets, weights, smoothing, chunk_tokens, compute_dtype):
    sums, grad_hidden, grad_embedding = _sums_and_grads(
        hidden, embedding, targets, weights, smoothing, chunk_tokens, compute_dtype
    )
    return sums, (grad_hidden.astype(hidden.dtype), grad_embedding.astype(embedding.dtype))


def _fused_backward(smoothing, chunk_tokens, compute_dtype, residuals, cotangent):
    grad_hidden, grad_embedding = residuals
    scale = cotangent[0]  # only the loss sum is differentiated; nll and accuracy are metrics
    return (
        (scale * grad_hidden).astype(grad_hidden.dtype),
        (scale * grad_embedding).astype(grad_embedding.dtype),
        None,
        None,
    )


_fused.defvjp(_fused_forward, _fused_backward)


def projected_token_losses(
    hidden: Float[Array, "B T D"],
    embedding: Float[Array, "V D"],
    targets: Int[Array, "B T"],
    weights: Float[Array, "B T"],
    smoothing: float = 0.1,
    chunk_tokens: int = 512,
    compute_dtype=jnp.float32,
) -> dict[str, Float[Array, ""]]:
    """`loss.token_losses(hidden @ embedding^T, ...)` without materialising the logits.

    `embedding` is the output projection as [V, D] (the tied embedding, or the untied kernel
    transposed). Chunks hold at most `chunk_tokens` target positions of the batch (<= 0: one
    chunk). Differentiable with respect to `hidden` and `embedding` through `loss_sum` only;
    `nll_sum` and `correct` are metrics.
    """
    weights = weights.astype(jnp.float32)
    sums = _fused(hidden, embedding, targets, weights, smoothing, chunk_tokens, compute_dtype)
    return {"loss_sum": sums[0], "nll_sum": sums[1], "correct": sums[2], "weight": jnp.sum(weights)}
