"""Beam search over a `tokens_to_logits` callback, jitted end to end: K hypotheses per row, scored
log p(Y) / length_penalty(|Y|), with the rules that stop a row (`BEAM_STOPS`).

The callback, the cache, the shape letters (K beams, R = B * K decoded rows), `SearchSpec` and how
a step's log-probabilities are constrained are search.py's, shared with greedy search and
sampling (see its module docstring). Beam search never looks inside the cache either: it repeats
each row's cache for the K beams and reorders those rows as beams survive.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.decoding.search import NEG_INF, SearchSpec, TokensToLogits, is_possible, run_growing, step_log_probs
from jaxformer.typing import Array, Bool, Float, Int

LENGTH_PENALTIES = ("gnmt", "transformers")
# When beam search stops expanding a row (see `beam_search`), and the same rule in transformers'
# `generate(early_stopping=...)`: "exact" (early_stopping="never"), "current_length" (False),
# "beam_full" (True; also fairseq's rule).
BEAM_STOPS = ("exact", "current_length", "beam_full")
# The largest length-penalty alpha. The search computes the penalty in float32 and counts tokens in
# int32, so a hypothesis may have up to 2**31 - 1: there |Y|^alpha passes float32's largest value
# (about 2**128) above alpha = 128 / 31 = 4.13, ((5 + |Y|) / 6)^alpha above 4.5, and an infinite
# penalty scores every hypothesis 0, alike. Checked (DecodeSettings, --alpha, the config's
# decoding.alpha and training.final_alphas) before any hypothesis' length is known, so it holds for
# both forms at any length; 4 leaves float32's rounding room.
MAX_ALPHA = 4.0
ALPHA_RULE = (
    f"a finite number from 0 to {MAX_ALPHA:g} (above it the length penalty overflows float32 on a "
    "hypothesis of up to 2**31 - 1 tokens, the longest the search counts, and every hypothesis ranks alike)"
)


def is_valid_alpha(value: Any) -> bool:
    """Whether the number `value` (an int, a float or a NumPy scalar, as the config may hold) is an
    alpha ALPHA_RULE allows: from 0 to MAX_ALPHA, NaN not (it would rank every hypothesis alike).
    The one test of DecodeSettings, --alpha and the config's decoding.alpha and training.final_alphas."""
    return bool(0 <= value <= MAX_ALPHA)  # False for NaN; bool: a NumPy scalar compares to np.bool_


def length_penalty(length, alpha: float, form: str = "gnmt"):
    """The beam-search length normalisation of a hypothesis of `length` tokens (EOS included):
    "gnmt", ((5 + |Y|) / 6)^alpha (Wu et al., 2016, the paper's), or "transformers", |Y|^alpha
    (Hugging Face transformers' beam search, whose length counts the generated tokens, EOS
    included and the decoder's start token not)."""
    if form not in LENGTH_PENALTIES:
        raise ValueError(f"unknown length penalty {form!r}; choose one of {', '.join(LENGTH_PENALTIES)}")
    length = jnp.asarray(length, jnp.float32)
    if form == "transformers":
        return length**alpha
    return ((5.0 + length) / 6.0) ** alpha


def top_k(values: Float[Array, "B N"], k: int, chunk: int = 64) -> tuple[Float[Array, "B k"], Int[Array, "B k"]]:
    """`jax.lax.top_k(values, k)`, ties to the lower index included, computed from the k chunks
    of `chunk` values with the highest maxima: XLA:CPU's top-k takes a few milliseconds over a
    beam search's K * V candidates per row, the chunk maxima and k * chunk values a fraction.
    (An element of the top k has at most k - 1 elements before it, so at most k - 1 chunks rank
    before its own; the chosen chunks are taken in index order, so ties resolve as top_k's do.)"""
    rows, count = values.shape
    if count < 4 * k * chunk:
        return tuple(jax.lax.top_k(values, k))
    padding = (-count) % chunk
    chunks = jnp.pad(values, ((0, 0), (0, padding)), constant_values=-jnp.inf).reshape(rows, -1, chunk)  # [B, C, c]
    _, best_chunks = jax.lax.top_k(jnp.max(chunks, axis=-1), k)  # [B, k]
    best_chunks = jnp.sort(best_chunks, axis=-1)
    picked = jnp.take_along_axis(chunks, best_chunks[:, :, None], axis=1).reshape(rows, k * chunk)  # [B, k * c]
    top_values, where = jax.lax.top_k(picked, k)  # [B, k]
    return top_values, jnp.take_along_axis(best_chunks, where // chunk, axis=1) * chunk + where % chunk


class BeamState(NamedTuple):
    """The loop state of beam search. Live beams are sorted best first; a slot with nothing
    in it (fewer possible hypotheses than K) has a log-probability or score of about NEG_INF."""

    step: Int[Array, ""]  # output tokens of every live beam
    live_log_probs: Float[Array, "B K"]  # log p of each live beam's tokens
    live_tokens: Int[Array, "B K L"]
    finished_tokens: Int[Array, "B K L"]  # the best K ended hypotheses, best first
    finished_scores: Float[Array, "B K"]  # their log p / length_penalty
    done: Bool[Array, B]  # the row's stop rule has held: its ended hypotheses are final
    cache: Any  # the callback's, B * K rows (row r is beam r % K of batch row r // K)


def _gather_beams(tree: Any, beam_indices: Int[Array, "B K"], batch_size: int, old_beams: int) -> Any:
    """Rows of every leaf (flattened [B * old_beams, ...]) picked by `beam_indices` [B, K]."""
    flat = (jnp.arange(batch_size)[:, None] * old_beams + beam_indices).reshape(-1)  # [B * K]
    # The indices are in bounds by construction; saying so spares a masking pass over every
    # cache leaf at every step (the default mode fills out-of-bounds rows; "clip" only clamps the indices).
    return jax.tree.map(lambda leaf: leaf if jnp.ndim(leaf) == 0 else jnp.take(leaf, flat, axis=0, mode="clip"), tree)


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    spec: SearchSpec,
    beam_size: int,
    alpha: float = 0.6,
    penalty: str = "gnmt",
    stop: str = "exact",
) -> tuple[Int[Array, "B K L"], Float[Array, "B K"]]:
    """Beam search with length penalty; returns the `beam_size` best ended sequences per row,
    best first, as (tokens [B, K, L] padded with 0, scores [B, K] = log p(Y) / length_penalty(|Y|),
    of the form `penalty` names: "gnmt" or "transformers", see `length_penalty`).
    `spec`'s `limits`, `banned_ids`, `first_banned` and `renormalize_after_bans` as in search.py's
    module docstring; a slot a row cannot fill (it has fewer than K possible sequences) scores
    about NEG_INF.

    `cache` holds one row per batch row; it is repeated for the K beams. Each step expands
    the live beams into their 2K best continuations; those ending in EOS that rank among the
    best K join the ended ones (so a beam of 1 is greedy search), the best K others stay live.
    A row is done once its `stop` rule holds; from then on nothing joins its ended sequences, so
    its result depends neither on the other rows of the batch nor on how long they run. The loop
    ends when every row is done (or at max_length).

    - "exact": no live beam can beat the worst kept ended sequence. Log-probabilities only
      decrease as a sequence grows, so a live beam's final score is at most its log p divided by
      the length penalty of the longest length it may still reach (its row's limit), or of the
      shortest when alpha < 0. Stopping there changes no result: this is the search run to the
      limit, and with alpha > 0 it often runs close to the limit.
    - "current_length": K sequences have ended and the best live beam's log p, divided by the
      length penalty of its current length, does not beat the worst of them (transformers'
      default, early_stopping=False). A live beam may still have won by growing longer.
    - "beam_full": K sequences have ended among the best K candidates of their steps (fairseq's
      rule; transformers' early_stopping=True). The fastest; the first K endings are final.

    The last two also end a row where "exact" does.
    """
    length_penalty(1, alpha, penalty)  # an unknown form fails here, before tracing
    if stop not in BEAM_STOPS:
        raise ValueError(f"unknown beam stop rule {stop!r}; choose one of {', '.join(BEAM_STOPS)}")
    B, K = spec.batch_size, beam_size
    max_length, bos_id, eos_id = spec.max_length, spec.bos_id, spec.eos_id
    limits = spec.row_limits()
    longest = jnp.full((B,), max_length, jnp.int32) if limits is None else limits  # [B]
    row_limits = None if limits is None else jnp.repeat(limits, K)  # [R]
    first_banned = None if spec.first_banned is None else jnp.repeat(spec.first_banned, K, axis=0)  # [R, V]
    cache = jax.tree.map(lambda leaf: leaf if jnp.ndim(leaf) == 0 else jnp.repeat(leaf, K, axis=0), cache)  # [R, ...]

    def rows_done(step, live_log_probs, finished_scores) -> Bool[Array, B]:
        """Where `stop` holds for live beams of `step` tokens and the kept ended sequences."""
        best_live, worst_kept = live_log_probs[:, 0], finished_scores[:, -1]  # [B], [B]
        if alpha == 0:
            best_possible = best_live
        else:  # best_live <= 0, so the bound is at one end of the lengths still reachable
            best_possible = jnp.maximum(
                best_live / length_penalty(longest, alpha, penalty),
                best_live / length_penalty(step + 1, alpha, penalty),
            )  # [B]
        done = ~(is_possible(best_live) & (best_possible > worst_kept))  # "exact"
        full = is_possible(worst_kept)  # K hypotheses have ended
        if stop == "current_length":
            done |= full & (best_live / length_penalty(step, alpha, penalty) <= worst_kept)
        elif stop == "beam_full":
            done |= full
        return done

    def body(state: BeamState) -> BeamState:
        step = state.step
        previous = jnp.where(step == 0, bos_id, state.live_tokens[:, :, jnp.maximum(step - 1, 0)])  # [B, K]
        logits, cache = tokens_to_logits(previous.reshape(B * K, 1), state.cache)  # [R, V]
        vocab = logits.shape[-1]
        log_probs = step_log_probs(logits, step, row_limits, spec, first_banned).reshape(B, K, vocab)  # [B, K, V]
        candidates = (state.live_log_probs[:, :, None] + log_probs).reshape(B, K * vocab)  # [B, K * V]
        top_log_probs, top_indices = top_k(candidates, min(2 * K, K * vocab))  # [B, 2K]
        top_beams, top_tokens = top_indices // vocab, (top_indices % vocab).astype(jnp.int32)  # [B, 2K]
        top_sequences = jnp.take_along_axis(state.live_tokens, top_beams[:, :, None], axis=1)  # [B, 2K, L]
        top_sequences = top_sequences.at[:, :, step].set(top_tokens)
        ends = top_tokens == eos_id  # [B, 2K]
        if limits is None:
            ends = ends | (step + 1 == max_length)  # cut as it stands

        # Ended: this step's ended candidates that rank among the best K join the kept ones;
        # the best K survive.
        in_top_k = jnp.arange(top_log_probs.shape[1])[None, :] < K  # [1, 2K]
        ended = ends & is_possible(top_log_probs) & in_top_k & ~state.done[:, None]  # [B, 2K]
        new_scores = jnp.where(ended, top_log_probs / length_penalty(step + 1, alpha, penalty), NEG_INF)  # [B, 2K]
        all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)  # [B, 3K]
        all_tokens = jnp.concatenate([state.finished_tokens, top_sequences], axis=1)  # [B, 3K, L]
        finished_scores, keep = jax.lax.top_k(all_scores, K)  # [B, K]
        finished_tokens = jnp.take_along_axis(all_tokens, keep[:, :, None], axis=1)  # [B, K, L]

        # Live: the best K candidates that did not end.
        live_log_probs, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_log_probs), K)  # [B, K]
        return BeamState(
            step=step + 1,
            live_log_probs=live_log_probs,
            live_tokens=jnp.take_along_axis(top_sequences, keep[:, :, None], axis=1),  # [B, K, L]
            finished_tokens=finished_tokens,
            finished_scores=finished_scores,
            done=state.done | rows_done(step + 1, live_log_probs, finished_scores),
            cache=_gather_beams(cache, jnp.take_along_axis(top_beams, keep, axis=1), B, K),
        )

    # Only beam 0 is live at the start, so the first step expands one hypothesis, not K copies.
    initial = BeamState(
        step=jnp.int32(0),
        live_log_probs=jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (K - 1), jnp.float32), (B, 1)),
        live_tokens=jnp.zeros((B, K, max_length), jnp.int32),
        finished_tokens=jnp.zeros((B, K, max_length), jnp.int32),
        finished_scores=jnp.full((B, K), NEG_INF, jnp.float32),
        done=jnp.zeros((B,), bool),
        cache=cache,
    )
    final = run_growing(body, lambda state: ~jnp.all(state.done), initial, max_length, spec.cache_growth)
    # Tokens after each sequence's EOS are padding.
    after_eos = jnp.cumsum(jnp.cumsum(final.finished_tokens == eos_id, axis=-1), axis=-1) > 1  # [B, K, L]
    return jnp.where(after_eos, 0, final.finished_tokens), final.finished_scores
