"""Greedy, sampling and beam search over a `tokens_to_logits` callback, jitted end to end.

Shapes use the letters of jaxformer/typing.py, plus the search's own:

    B  batch (source rows)    K  beams (hypotheses per row)    R  decoded rows (B, or B * K)
    L  max_length             V  vocabulary

The callback sees the newest token of every row, `tokens` int32 [R, 1], and a cache pytree
whose array leaves have R rows first (scalar leaves, such as a step index, are shared by all
rows), and returns float logits [R, V] for the next token with the updated cache. The search
never looks inside the cache: beam search only repeats and reorders its rows. What every search
knows of its sequences is a `SearchSpec`: they start with `bos_id` (the first decoder input, not
part of the output) and end at `eos_id`.

A cache need not hold max_length positions from the start. Reading and reordering it costs in
proportion to its length at every step, while most searches end long before max_length, so a
`CacheGrowth` in the spec lets the cache start short and grow (`CacheGrowth.grow`, which keeps
what it holds) only when the search reaches its end; the results are those of a full-length cache.

Scores are the model's own log-probabilities. The search takes the full-vocabulary
log_softmax of the logits and only then applies its constraints, by setting the log-probability
of a forbidden token to NEG_INF (nothing is renormalised):

- `banned_ids` (pad and BOS, for a jaxformer model) are never generated;
- `limits` [B]: row b ends by `limits[b]` tokens, EOS included. At the step where a sequence
  reaches its limit only EOS is allowed, and it costs its real log p(EOS).

So a returned score is log p(Y) (greedy search, sampling) or log p(Y) / length_penalty(|Y|)
(beam search), |Y| counting EOS: what a full forward pass over Y gives. Without `limits`, a
sequence that reaches `max_length` tokens is cut there as it stands, without EOS (for callers
that force a fixed output length, such as benchmarks/decoding.py).

A spec with `renormalize_after_bans` removes the forbidden tokens before the log_softmax
instead, so that each step's log-probabilities are normalised over the tokens allowed there
(transformers' generate with renormalize_logits=True, which an OPUS-MT model may ask for): a
score sums log softmax(logits over the allowed tokens)[y_t], EOS at a row's limit costs 0. It
changes scores, and so which hypotheses beam search keeps; greedy search and sampling choose
the same tokens (the shift is the same for every token of a row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.typing import Array, Bool, Float, Int

TokensToLogits = Callable[[Int[Array, "R 1"], Any], tuple[Float[Array, "R V"], Any]]
NEG_INF = -1.0e9  # the log-probability of an impossible token, without inf arithmetic


LENGTH_PENALTIES = ("gnmt", "transformers")
# When beam search stops expanding a row (see `beam_search`), and the same rule in transformers'
# `generate(early_stopping=...)`: "exact" (early_stopping="never"), "current_length" (False),
# "beam_full" (True; also fairseq's rule).
BEAM_STOPS = ("exact", "current_length", "beam_full")


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


class CacheGrowth(NamedTuple):
    """The callback's cache starts with room for `lengths[0]` tokens; when the search reaches
    that many it becomes `grow(cache, lengths[1])`, and so on, the last time to max_length."""

    lengths: tuple[int, ...]  # increasing, each below max_length
    grow: Callable[[Any, int], Any]  # (cache, length) -> the same cache with room for `length` tokens

    @classmethod
    def doubling(cls, first: int, max_length: int, grow: Callable[[Any, int], Any]) -> CacheGrowth | None:
        """first, 2 first, 4 first, ... while max_length is at least twice the length (so no phase
        adds only a few positions); None when max_length < 2 first (one full-length cache)."""
        lengths = []
        while 2 * first <= max_length:
            lengths.append(first)
            first *= 2
        return cls(tuple(lengths), grow) if lengths else None


def _run_growing(
    body: Callable[[Any], Any], running: Callable[[Any], Bool[Array, ""]], initial: Any, max_length: int, growth
) -> Any:
    """`while step < max_length and running(state): state = body(state)`, for a state with
    `step` and `cache` fields, growing the cache as `growth` (a CacheGrowth or None) says."""
    lengths = () if growth is None else growth.lengths
    state = initial
    for length, next_length in zip(lengths, (*lengths[1:], max_length)):
        state = jax.lax.while_loop(lambda state, end=length: (state.step < end) & running(state), body, state)
        state = state._replace(cache=growth.grow(state.cache, next_length))
    return jax.lax.while_loop(lambda state: (state.step < max_length) & running(state), body, state)


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


def _is_possible(log_probs: Float[Array, ...]) -> Bool[Array, ...]:
    """True where a (sum of) log-probabilities involves no forbidden token."""
    return log_probs > NEG_INF / 2


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    """What every search needs to know of the sequences it decodes (see the module docstring).

    Checked when built: `limits` must have shape [B] (it may be a traced array: only its shape
    is looked at here), and `eos_id` may not be banned. `banned_ids` is kept as a tuple of ints."""

    batch_size: int  # B, source rows
    max_length: int  # L, the token buffers' length
    bos_id: int  # the first decoder input, not part of the output
    eos_id: int  # ends a sequence
    _: dataclasses.KW_ONLY
    limits: Int[Array, B] | None = None  # row b ends by limits[b] tokens, EOS included
    banned_ids: Sequence[int] = ()  # never generated (pad and BOS for a jaxformer model)
    cache_growth: CacheGrowth | None = None  # None: the cache holds max_length tokens from the start
    # Each step's log-probabilities normalised over the tokens allowed there (see the module docstring).
    renormalize_after_bans: bool = False

    def __post_init__(self):
        if self.limits is not None and jnp.shape(self.limits) != (self.batch_size,):
            raise ValueError(f"limits must have shape ({self.batch_size},), one per row; got {jnp.shape(self.limits)}")
        banned_ids = tuple(int(token) for token in self.banned_ids)
        if self.eos_id in banned_ids:
            raise ValueError(f"eos_id {self.eos_id} cannot be banned: every sequence must be able to end")
        if self.cache_growth is not None:
            lengths = self.cache_growth.lengths
            if not lengths or list(lengths) != sorted(set(lengths)) or lengths[0] < 1 or lengths[-1] >= self.max_length:
                raise ValueError(
                    f"cache lengths must increase from >= 1 to below max_length {self.max_length}: {lengths}"
                )
        object.__setattr__(self, "banned_ids", banned_ids)

    def row_limits(self) -> Int[Array, B] | None:
        """`limits` as int32, at most max_length (the token buffers hold max_length tokens)."""
        if self.limits is None:
            return None
        return jnp.minimum(jnp.asarray(self.limits, jnp.int32), self.max_length)


def _step_log_probs(
    logits: Float[Array, "R V"],
    step: Int[Array, ""],
    limits: Int[Array, R] | None,
    spec: SearchSpec,
) -> Float[Array, "R V"]:
    """The log-probabilities of row r's output token number `step` + 1, NEG_INF at the tokens it
    may not take: the banned ones, and everything but EOS once that token reaches the row's limit
    (`limits`, one per row). The others keep their full-vocabulary log-probabilities, or with
    `spec.renormalize_after_bans` those of the allowed tokens alone."""
    logits = logits.astype(jnp.float32)
    if limits is None and not spec.banned_ids:
        return jax.nn.log_softmax(logits, axis=-1)
    vocab = logits.shape[-1]
    allowed = jnp.asarray(~np.isin(np.arange(vocab), spec.banned_ids))[None, :]  # [1, V]
    if limits is not None:
        must_end = (step + 1 >= limits)[:, None]  # [R, 1]
        is_eos = (jnp.arange(vocab) == spec.eos_id)[None, :]  # [1, V]
        allowed = jnp.where(must_end, is_eos, allowed)  # [R, V]
    if spec.renormalize_after_bans:  # EOS is never banned: every row keeps a token to normalise over
        logits = jnp.where(allowed, logits, -jnp.inf)
    return jnp.where(allowed, jax.nn.log_softmax(logits, axis=-1), NEG_INF)


# -- one hypothesis per row: greedy search and sampling --------------------------------------


class SearchState(NamedTuple):
    """The loop state of greedy search and sampling."""

    step: Int[Array, ""]  # output tokens decoded so far (by the rows still running)
    tokens: Int[Array, "B L"]  # output tokens, 0 after EOS
    finished: Bool[Array, B]  # the row has emitted EOS
    scores: Float[Array, B]  # log p of the tokens so far
    cache: Any  # the callback's, B rows
    rng: jax.Array


def _one_per_row(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    spec: SearchSpec,
    choose: Callable[[Float[Array, "B V"], jax.Array], Int[Array, B]],
    rng: jax.Array,
) -> tuple[Int[Array, "B L"], Float[Array, B]]:
    """Extends every row by the token `choose(log_probs [B, V], rng) -> [B]` picks until EOS;
    `log_probs` carry NEG_INF at the forbidden tokens, which `choose` must never pick."""
    batch_size, max_length, bos_id, eos_id = spec.batch_size, spec.max_length, spec.bos_id, spec.eos_id
    limits = spec.row_limits()

    def body(state: SearchState) -> SearchState:
        step = state.step
        previous = jnp.where(step == 0, bos_id, state.tokens[:, jnp.maximum(step - 1, 0)])[:, None]  # [B, 1]
        logits, cache = tokens_to_logits(previous, state.cache)  # [B, V]
        log_probs = _step_log_probs(logits, step, limits, spec)  # [B, V]
        rng, step_rng = jax.random.split(state.rng)
        chosen = choose(log_probs, step_rng).astype(jnp.int32)  # [B]
        chosen_log_prob = jnp.take_along_axis(log_probs, chosen[:, None], axis=-1)[:, 0]  # [B]
        return SearchState(
            step=step + 1,
            tokens=state.tokens.at[:, step].set(jnp.where(state.finished, 0, chosen)),
            finished=state.finished | (chosen == eos_id),
            scores=state.scores + jnp.where(state.finished, 0.0, chosen_log_prob),
            cache=cache,
            rng=rng,
        )

    initial = SearchState(
        step=jnp.int32(0),
        tokens=jnp.zeros((batch_size, max_length), jnp.int32),
        finished=jnp.zeros((batch_size,), bool),
        scores=jnp.zeros((batch_size,), jnp.float32),
        cache=cache,
        rng=rng,
    )
    final = _run_growing(body, lambda state: ~jnp.all(state.finished), initial, max_length, spec.cache_growth)
    return final.tokens, final.scores


def greedy_search(
    tokens_to_logits: TokensToLogits, cache: Any, spec: SearchSpec
) -> tuple[Int[Array, "B L"], Float[Array, B]]:
    """The most likely allowed token at every step: (tokens [B, L] padded with 0 after EOS,
    log p(tokens) [B] under the model). `spec`'s `limits`, `banned_ids` and
    `renormalize_after_bans` as in the module docstring."""
    return _one_per_row(
        tokens_to_logits, cache, spec, lambda log_probs, rng: jnp.argmax(log_probs, axis=-1), jax.random.key(0)
    )


def sample_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    spec: SearchSpec,
    rng: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
) -> tuple[Int[Array, "B L"], Float[Array, B]]:
    """Ancestral sampling from softmax(logits / temperature) over the allowed tokens, restricted
    to the `top_k` most likely of them when `top_k` > 0: (tokens [B, L], log p(tokens) [B] under
    the model itself, untempered). `spec`'s `limits`, `banned_ids` and `renormalize_after_bans` as in
    the module docstring."""
    if temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {temperature}; use greedy_search for argmax")

    def choose(log_probs, rng):  # [B, V], NEG_INF where forbidden
        scaled = jnp.where(_is_possible(log_probs), log_probs / temperature, -jnp.inf)  # [B, V]
        if top_k > 0:
            kth_best = jax.lax.top_k(scaled, min(top_k, scaled.shape[-1]))[0][:, -1:]  # [B, 1]
            scaled = jnp.where(scaled >= kth_best, scaled, -jnp.inf)
        return jax.random.categorical(rng, scaled, axis=-1)

    return _one_per_row(tokens_to_logits, cache, spec, choose, rng)


# -- beam search -----------------------------------------------------------------------------


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
    `spec`'s `limits`, `banned_ids` and `renormalize_after_bans` as in the module docstring; a
    slot a row cannot fill (it has fewer than K possible sequences) scores about NEG_INF.

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
        done = ~(_is_possible(best_live) & (best_possible > worst_kept))  # "exact"
        full = _is_possible(worst_kept)  # K hypotheses have ended
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
        log_probs = _step_log_probs(logits, step, row_limits, spec).reshape(B, K, vocab)  # [B, K, V]
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
        ended = ends & _is_possible(top_log_probs) & in_top_k & ~state.done[:, None]  # [B, 2K]
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
    final = _run_growing(body, lambda state: ~jnp.all(state.done), initial, max_length, spec.cache_growth)
    # Tokens after each sequence's EOS are padding.
    after_eos = jnp.cumsum(jnp.cumsum(final.finished_tokens == eos_id, axis=-1), axis=-1) > 1  # [B, K, L]
    return jnp.where(after_eos, 0, final.finished_tokens), final.finished_scores
