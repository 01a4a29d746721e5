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
batch-sharded step stays batch-sharded. Each chunk runs loss.py's `token_terms` and
`logits_gradient`, so the same sums as `loss.token_losses` come out.

With R-Drop (`rdrop_alpha` > 0), rows come in pairs, 2i and 2i + 1: one example under two
dropout draws. The pair's symmetric KL divergence (loss.py's `pair_consistency`, with its
closed-form gradient) joins the loss, and the sums count each example once: the pair's mean
cross-entropy plus alpha / 2 times its divergence, which is R-Drop's objective (both
cross-entropies plus alpha times the divergence) halved, with the weight of one copy.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxformer.training.loss import logits_gradient, pair_consistency, token_terms, weighted_sums
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


_SUMS = ("loss_sum", "nll_sum", "correct")  # what the chunks add up; the weight needs no chunks
_CONSISTENCY = "consistency_sum"  # R-Drop's divergence, summed over the examples' tokens


def _sum_keys(rdrop_alpha: float) -> tuple[str, ...]:
    return _SUMS + (_CONSISTENCY,) if rdrop_alpha > 0 else _SUMS


def _pairs(x):  # [2P, ...] -> [P, 2, ...]: rows 2i and 2i + 1, one example under two dropout draws
    return x.reshape(x.shape[0] // 2, 2, *x.shape[1:])


def _chunk(
    hidden, embedding, bias, targets, weights, smoothing: float, compute_dtype, rdrop_alpha: float, whole: bool = False
):
    """Sums and gradients for one chunk: hidden [B, t, D], targets and weights [B, t]; `bias`
    [V] or None. The bias's gradient is the logits' gradient summed over the chunk's positions.
    With `rdrop_alpha` > 0 the rows are R-Drop pairs (see the module's doc). The embedding's
    gradient comes as [D, V], or as [V, D] when the chunk is the `whole` batch."""
    hidden_operand = hidden.astype(compute_dtype)  # [B, t, D]: the logits' and the embedding gradient's
    logits = jnp.einsum(
        "BTD,VD->BTV", hidden_operand, embedding.astype(compute_dtype), preferred_element_type=jnp.float32
    )  # [B, t, V]
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)[None, None]
    terms = token_terms(logits, targets, smoothing)
    sums = {
        key: value for key, value in weighted_sums(terms, weights).items() if key in _SUMS
    }  # weight: summed once, outside
    grad_logits = logits_gradient(terms, weights, smoothing)  # [B, t, V]
    if rdrop_alpha > 0:
        log_probs = logits - terms.log_normalizer[..., None]  # [B, t, V]
        divergence, grad_divergence = pair_consistency(
            _pairs(log_probs), _pairs(terms.softmax())
        )  # [B/2, t], [B/2, 2, t, V]
        example_weights = _pairs(weights)[:, 0]  # [B/2, t]: both copies weigh the same
        sums = {key: 0.5 * value for key, value in sums.items()}
        sums[_CONSISTENCY] = jnp.sum(divergence * example_weights)
        sums["loss_sum"] = sums["loss_sum"] + 0.5 * rdrop_alpha * sums[_CONSISTENCY]
        grad_divergence = example_weights[:, None, :, None] * grad_divergence  # [B/2, 2, t, V]
        grad_logits = 0.5 * (grad_logits + rdrop_alpha * grad_divergence.reshape(grad_logits.shape))
    grad_logits = grad_logits.astype(compute_dtype)
    grad_hidden = jnp.einsum(
        "BTV,VD->BTD", grad_logits, embedding.astype(compute_dtype), preferred_element_type=jnp.float32
    )  # [B, t, D]
    # The embedding's gradient as [D, V]: with the chunk's tokens as the contracted rows of both
    # operands XLA:CPU reads the logit gradient in place, where [V, D] made it copy a transposed
    # [V, B * t] of it every chunk (the fused loss runs 1.07x faster for `base`, 1.25x for
    # `small`; the chunks' sums are transposed once, in _sums_and_grads).
    # One chunk: [V, D] straight away. XLA folds a transpose of the [D, V] product into the dot, and
    # with bf16 operands XLA:CPU (jax 0.10.2, AVX512-BF16) left that folded dot to a kernel without
    # bf16 x bf16 -> float32, failing at run time with UNIMPLEMENTED.
    if whole:
        grad_embedding = jnp.einsum("BTV,BTD->VD", grad_logits, hidden_operand, preferred_element_type=jnp.float32)
    else:
        grad_embedding = jnp.einsum("BTD,BTV->DV", hidden_operand, grad_logits, preferred_element_type=jnp.float32)
    grad_bias = None if bias is None else jnp.sum(grad_logits.astype(jnp.float32), axis=(0, 1))  # [V]
    return sums, grad_hidden, (grad_embedding, grad_bias)


def _sums_and_grads(hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha):
    batch, length, d_model = hidden.shape
    chunk = chunk_length(batch, length, chunk_tokens)
    num_chunks = length // chunk
    if num_chunks == 1:
        return _chunk(hidden, embedding, bias, targets, weights, smoothing, compute_dtype, rdrop_alpha, whole=True)

    def split(x):  # [B, T, ...] -> [C, B, t, ...]
        return jnp.moveaxis(x.reshape(batch, num_chunks, chunk, *x.shape[2:]), 1, 0)

    def body(carry, pieces):
        sums, projection_grads = carry
        piece_sums, grad_hidden, piece_projection_grads = _chunk(
            pieces[0], embedding, bias, *pieces[1:], smoothing, compute_dtype, rdrop_alpha
        )
        sums = jax.tree.map(jnp.add, sums, piece_sums)
        return (sums, jax.tree.map(jnp.add, projection_grads, piece_projection_grads)), grad_hidden

    projection_grads = (
        jnp.zeros(embedding.shape[::-1], jnp.float32),  # [D, V]
        None if bias is None else jnp.zeros(bias.shape, jnp.float32),
    )
    initial = ({key: jnp.zeros((), jnp.float32) for key in _sum_keys(rdrop_alpha)}, projection_grads)
    (sums, (grad_embedding_t, grad_bias)), grad_hidden = jax.lax.scan(
        body, initial, (split(hidden), split(targets), split(weights))
    )
    grad_hidden = jnp.moveaxis(grad_hidden, 0, 1).reshape(batch, length, d_model)  # [B, T, D]
    return sums, grad_hidden, (grad_embedding_t.T, grad_bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha):
    sums, _, _ = _sums_and_grads(
        hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha
    )
    return sums


def _fused_forward(hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha):
    sums, grad_hidden, (grad_embedding, grad_bias) = _sums_and_grads(
        hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha
    )
    grad_bias = None if bias is None else grad_bias.astype(bias.dtype)
    return sums, (grad_hidden.astype(hidden.dtype), grad_embedding.astype(embedding.dtype), grad_bias)


def _fused_backward(smoothing, chunk_tokens, compute_dtype, rdrop_alpha, residuals, cotangent):
    grad_hidden, grad_embedding, grad_bias = residuals
    # Only the loss sum is differentiated; nll, accuracy and the divergence are metrics.
    scale = cotangent["loss_sum"]
    return (
        (scale * grad_hidden).astype(grad_hidden.dtype),
        (scale * grad_embedding).astype(grad_embedding.dtype),
        None if grad_bias is None else (scale * grad_bias).astype(grad_bias.dtype),
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
    bias: Float[Array, V] | None = None,
    rdrop_alpha: float = 0.0,
) -> dict[str, Float[Array, ""]]:
    """`loss.token_losses(hidden @ embedding^T + bias, ...)` without materialising the logits.

    `embedding` is the output projection as [V, D] (the tied embedding, or the untied kernel
    transposed); `bias` the output bias [V] (`TransformerConfig.logits_bias`), or None. Chunks
    hold at most `chunk_tokens` target positions of the batch (<= 0: one chunk). Differentiable
    with respect to `hidden`, `embedding` and `bias` through `loss_sum` only; `nll_sum` and
    `correct` are metrics.

    `rdrop_alpha` > 0: R-Drop. Rows 2i and 2i + 1 hold one example under two dropout draws (B
    even); every sum is the pair's mean, `loss_sum` adds alpha / 2 times `consistency_sum` (the
    pairs' symmetric KL divergence, summed over their tokens), and `weight` counts each example's
    tokens once.
    """
    if rdrop_alpha > 0 and hidden.shape[0] % 2:
        raise ValueError(f"R-Drop needs its rows in pairs: an even batch, not {hidden.shape[0]} rows")
    weights = weights.astype(jnp.float32)
    sums = _fused(hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha)
    weight = jnp.sum(weights)
    return {**sums, "weight": 0.5 * weight if rdrop_alpha > 0 else weight}
