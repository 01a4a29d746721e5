"""What every search over a `tokens_to_logits` callback shares (the callback, `SearchSpec`, each
step's constrained log-probabilities, the loop that grows the cache), and the searches that keep
one hypothesis per row: greedy search and sampling, jitted end to end. Beam search, which builds
on these, is beam_search.py.

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
  reaches its limit only EOS is allowed, and it costs its real log p(EOS);
- `first_banned` [B, V]: row b's first output token is none where `first_banned[b]` is True,
  EOS excepted (a language model's continuation of a prompt that ended in a space, which must
  start a new word: language_model.py).

So a returned score is log p(Y) (greedy search, sampling) or log p(Y) / length_penalty(|Y|)
(beam search, beam_search.py's `length_penalty`), |Y| counting EOS: what a full forward pass
over Y gives. Without `limits`, a sequence that reaches `max_length` tokens is cut there as it
stands, without EOS (for callers that force a fixed output length, such as benchmarks/decoding.py).

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


def run_growing(
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


def is_possible(log_probs: Float[Array, ...]) -> Bool[Array, ...]:
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
    first_banned: Bool[Array, "B V"] | None = None  # row b's first token is none where True (EOS excepted)
    banned_ids: Sequence[int] = ()  # never generated (pad and BOS for a jaxformer model)
    cache_growth: CacheGrowth | None = None  # None: the cache holds max_length tokens from the start
    # Each step's log-probabilities normalised over the tokens allowed there (see the module docstring).
    renormalize_after_bans: bool = False

    def __post_init__(self):
        if self.limits is not None and jnp.shape(self.limits) != (self.batch_size,):
            raise ValueError(f"limits must have shape ({self.batch_size},), one per row; got {jnp.shape(self.limits)}")
        banned_shape = None if self.first_banned is None else jnp.shape(self.first_banned)
        if banned_shape is not None and (len(banned_shape) != 2 or banned_shape[0] != self.batch_size):
            raise ValueError(
                f"first_banned must be [{self.batch_size}, vocabulary], one row per row; got {banned_shape}"
            )
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


def step_log_probs(
    logits: Float[Array, "R V"],
    step: Int[Array, ""],
    limits: Int[Array, R] | None,
    spec: SearchSpec,
    first_banned: Bool[Array, "R V"] | None = None,
) -> Float[Array, "R V"]:
    """The log-probabilities of row r's output token number `step` + 1, NEG_INF at the tokens it
    may not take: the banned ones, at the first step those `first_banned` (one row per row) marks
    but EOS, and everything but EOS once that token reaches the row's limit (`limits`, one per
    row). The others keep their full-vocabulary log-probabilities, or with
    `spec.renormalize_after_bans` those of the allowed tokens alone."""
    logits = logits.astype(jnp.float32)
    if limits is None and not spec.banned_ids and first_banned is None:
        return jax.nn.log_softmax(logits, axis=-1)
    vocab = logits.shape[-1]
    allowed = jnp.asarray(~np.isin(np.arange(vocab), spec.banned_ids))[None, :]  # [1, V]
    is_eos = (jnp.arange(vocab) == spec.eos_id)[None, :]  # [1, V]
    if first_banned is not None:  # never EOS: every sequence must be able to end
        allowed = allowed & ~((step == 0) & first_banned & ~is_eos)  # [R, V]
    if limits is not None:
        must_end = (step + 1 >= limits)[:, None]  # [R, 1]
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
        log_probs = step_log_probs(logits, step, limits, spec, spec.first_banned)  # [B, V]
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
    final = run_growing(body, lambda state: ~jnp.all(state.finished), initial, max_length, spec.cache_growth)
    return final.tokens, final.scores


def greedy_search(
    tokens_to_logits: TokensToLogits, cache: Any, spec: SearchSpec
) -> tuple[Int[Array, "B L"], Float[Array, B]]:
    """The most likely allowed token at every step: (tokens [B, L] padded with 0 after EOS,
    log p(tokens) [B] under the model). `spec`'s `limits`, `banned_ids`, `first_banned` and
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
    the model itself, untempered). `spec`'s `limits`, `banned_ids`, `first_banned` and
    `renormalize_after_bans` as in the module docstring."""
    if temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {temperature}; use greedy_search for argmax")

    def choose(log_probs, rng):  # [B, V], NEG_INF where forbidden
        # Divided after the row's best is subtracted (the same softmax): the best stays at 0, where a
        # tiny temperature (1e-40; 1e-46 is float32's 0) made every token -inf, and id 0, pad, was drawn.
        best = jnp.max(log_probs, axis=-1, keepdims=True)  # [B, 1]
        tempered = jnp.where(log_probs >= best, 0.0, (log_probs - best) / temperature)  # [B, V]
        scaled = jnp.where(is_possible(log_probs), tempered, -jnp.inf)  # [B, V]
        if top_k > 0:
            kth_best = jax.lax.top_k(scaled, min(top_k, scaled.shape[-1]))[0][:, -1:]  # [B, 1]
            scaled = jnp.where(scaled >= kth_best, scaled, -jnp.inf)
        return jax.random.categorical(rng, scaled, axis=-1)

    return _one_per_row(tokens_to_logits, cache, spec, choose, rng)
