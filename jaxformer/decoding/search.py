"""Greedy and beam search over a `tokens_to_logits` callback, jitted end to end.

The callback sees the newest token of every row, `tokens` int32 [R, 1], and a cache pytree
whose array leaves have R rows first (scalar leaves, such as a step index, are shared by all
rows), and returns float logits [R, V] for the next token with the updated cache. The search
never looks inside the cache: beam search only repeats and reorders its rows. Sequences
start with `bos_id`; a sequence ends at `eos_id` or after `max_length` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.typing import Array, Float, Int

TokensToLogits = Callable[[Int[Array, "R 1"], Any], tuple[Float[Array, "R V"], Any]]
NEG_INF = -1.0e9  # "impossible" without inf arithmetic


def length_penalty(length, alpha: float):
    """((5 + |Y|) / 6)^alpha (Wu et al., 2016), the paper's beam-search length normalisation."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _one_per_row(tokens_to_logits, cache, batch_size, max_length, bos_id, eos_id, choose, rng):
    """Extends every row by the token `choose(log_probs [B, V], rng) -> [B]` picks until EOS."""

    def cond(state):
        step, _, finished, _, _, _ = state
        return (step < max_length) & ~jnp.all(finished)

    def body(state):
        step, tokens, finished, scores, cache, rng = state
        previous = jnp.where(step == 0, bos_id, tokens[:, jnp.maximum(step - 1, 0)])[:, None]  # [B, 1]
        logits, cache = tokens_to_logits(previous, cache)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B, V]
        rng, step_rng = jax.random.split(rng)
        chosen = choose(log_probs, step_rng).astype(jnp.int32)  # [B]
        chosen_log_prob = jnp.take_along_axis(log_probs, chosen[:, None], axis=-1)[:, 0]
        scores = scores + jnp.where(finished, 0.0, chosen_log_prob)
        tokens = tokens.at[:, step].set(jnp.where(finished, 0, chosen))
        return step + 1, tokens, finished | (chosen == eos_id), scores, cache, rng

    initial = (
        jnp.int32(0), jnp.zeros((batch_size, max_length), jnp.int32), jnp.zeros((batch_size,), bool),
        jnp.zeros((batch_size,), jnp.float32), cache, rng,
    )
    _, tokens, _, scores, _, _ = jax.lax.while_loop(cond, body, initial)
    return tokens, scores


def greedy_search(
    tokens_to_logits: TokensToLogits, cache: Any, batch_size: int, max_length: int, bos_id: int, eos_id: int
) -> tuple[Int[Array, "B L"], Float[Array, "B"]]:
    """Most likely next token at every step: (tokens [B, L] padded with 0 after EOS, log-probabilities [B])."""
    return _one_per_row(
        tokens_to_logits, cache, batch_size, max_length, bos_id, eos_id,
        lambda log_probs, rng: jnp.argmax(log_probs, axis=-1), jax.random.key(0),
    )


def sample_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    max_length: int,
    bos_id: int,
    eos_id: int,
    rng: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
) -> tuple[Int[Array, "B L"], Float[Array, "B"]]:
    """Ancestral sampling from softmax(logits / temperature), restricted to the `top_k` most
    likely tokens when `top_k` > 0: (tokens [B, L], log-probabilities [B] under the model)."""
    if temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {temperature}; use greedy_search for argmax")

    def choose(log_probs, rng):  # [B, V]
        scaled = log_probs / temperature
        if top_k > 0:
            kth_best = jax.lax.top_k(scaled, min(top_k, scaled.shape[-1]))[0][:, -1:]  # [B, 1]
            scaled = jnp.where(scaled >= kth_best, scaled, -jnp.inf)
        return jax.random.categorical(rng, scaled, axis=-1)

    return _one_per_row(tokens_to_logits, cache, batch_size, max_length, bos_id, eos_id, choose, rng)


def _gather_beams(tree: Any, beam_indices: Int[Array, "B K"], batch_size: int, old_beams: int) -> Any:
    """Rows of every leaf (flattened [B * old_beams, ...]) picked by `beam_indices` [B, K]."""
    flat = (jnp.arange(batch_size)[:, None] * old_beams + beam_indices).reshape(-1)  # [B * K]
    # The indices are in bounds by construction; saying so spares a masking pass over every
    # cache leaf at every step (the default mode fills out-of-bounds rows; "clip" only clamps the indices).
    return jax.tree.map(
        lambda leaf: leaf if jnp.ndim(leaf) == 0 else jnp.take(leaf, flat, axis=0, mode="clip"), tree
    )


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    beam_size: int,
    max_length: int,
    bos_id: int,
    eos_id: int,
    alpha: float = 0.6,
) -> tuple[Int[Array, "B K L"], Float[Array, "B K"]]:
    """Beam search with length penalty; returns the `beam_size` best finished sequences per row,
    best first, as (tokens [B, K, L] padded with 0, scores [B, K] = log p(Y) / length_penalty).

    `cache` holds one row per batch row; it is repeated for the K beams. A sequence that reaches
    `max_length` without EOS counts as finished there. The loop stops early once no live beam
    can beat the worst kept finished sequence of its row.
    """
    B, K = batch_size, beam_size
    cache = jax.tree.map(lambda leaf: leaf if jnp.ndim(leaf) == 0 else jnp.repeat(leaf, K, axis=0), cache)  # [B * K, ...]
    # Only beam 0 is live at the start, so the first step expands one hypothesis, not K copies.
    live_log_probs = jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (K - 1), jnp.float32), (B, 1))  # [B, K]
    live_tokens = jnp.zeros((B, K, max_length), jnp.int32)
    finished_tokens = jnp.zeros((B, K, max_length), jnp.int32)
    finished_scores = jnp.full((B, K), NEG_INF, jnp.float32)

    def cond(state):
        step, live_log_probs, _, _, finished_scores, _ = state
        best_possible = live_log_probs[:, 0] / length_penalty(max_length, alpha) if alpha > 0 else live_log_probs[:, 0]
        can_improve = jnp.any(best_possible > finished_scores[:, -1])
        return (step < max_length) & can_improve

    def body(state):
        step, live_log_probs, live_tokens, finished_tokens, finished_scores, cache = state
        previous = jnp.where(step == 0, bos_id, live_tokens[:, :, jnp.maximum(step - 1, 0)])  # [B, K]
        logits, cache = tokens_to_logits(previous.reshape(B * K, 1), cache)
        vocab = logits.shape[-1]
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(B, K, vocab)
        candidates = (live_log_probs[:, :, None] + log_probs).reshape(B, K * vocab)  # [B, K * V]
        top_log_probs, top_indices = jax.lax.top_k(candidates, min(2 * K, K * vocab))  # [B, 2K]
        top_beams, top_tokens = top_indices // vocab, (top_indices % vocab).astype(jnp.int32)
        top_sequences = jnp.take_along_axis(live_tokens, top_beams[:, :, None], axis=1)  # [B, 2K, L]
        top_sequences = top_sequences.at[:, :, step].set(top_tokens)
        ends = (top_tokens == eos_id) | (step + 1 == max_length)  # [B, 2K]
        valid = top_log_probs > NEG_INF / 2

        # Finished: this step's ended candidates that rank among the best K (an EOS that would
        # have won a beam slot; so a beam of 1 is greedy search) join the kept ones; best K survive.
        in_top_k = jnp.arange(top_log_probs.shape[1])[None, :] < K
        new_scores = jnp.where(ends & valid & in_top_k, top_log_probs / length_penalty(step + 1, alpha), NEG_INF)
        all_scores = jnp.concatenate([finished_scores, new_scores], axis=1)  # [B, 3K]
        all_tokens = jnp.concatenate([finished_tokens, top_sequences], axis=1)
        finished_scores, keep = jax.lax.top_k(all_scores, K)
        finished_tokens = jnp.take_along_axis(all_tokens, keep[:, :, None], axis=1)

        # Live: the best K candidates that did not end.
        live_candidates = jnp.where(ends, NEG_INF, top_log_probs)
        live_log_probs, keep = jax.lax.top_k(live_candidates, K)  # [B, K]
        live_tokens = jnp.take_along_axis(top_sequences, keep[:, :, None], axis=1)
        cache = _gather_beams(cache, jnp.take_along_axis(top_beams, keep, axis=1), B, K)
        return step + 1, live_log_probs, live_tokens, finished_tokens, finished_scores, cache

    state = (jnp.int32(0), live_log_probs, live_tokens, finished_tokens, finished_scores, cache)
    _, _, _, finished_tokens, finished_scores, _ = jax.lax.while_loop(cond, body, state)
    # Tokens after each sequence's EOS are padding.
    after_eos = jnp.cumsum(jnp.cumsum(finished_tokens == eos_id, axis=-1), axis=-1) > 1
    return jnp.where(after_eos, 0, finished_tokens), finished_scores
