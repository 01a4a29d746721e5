"""Translation of token arrays: the encoder once per batch, then a search over cached decoder steps.

`generate(model, params, source, settings, rng)` is a pure, jittable function of arrays, for
other JAX programs; `make_generate_fn` jits it for one model and one set of settings.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.decoding.beam_search import ALPHA_RULE, BEAM_STOPS, LENGTH_PENALTIES, beam_search, is_valid_alpha
from jaxformer.decoding.search import CacheGrowth, SearchSpec, TokensToLogits, greedy_search, sample_search
from jaxformer.decoding.sentence_batches import MAX_SOURCE_TOKENS
from jaxformer.model.cache import init_cache
from jaxformer.model.config import ConfigError, TransformerConfig, set_python_scalar_fields
from jaxformer.model.transformer import Transformer, unstack_layers
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID
from jaxformer.typing import Array, Float, Int

METHODS = ("beam", "greedy", "sample")
# The decoder cache starts with room for this many output tokens and doubles when a search needs
# more (search.py's CacheGrowth): most translations are far shorter than source + 50 tokens, and
# every step reads, and beam search reorders, the whole cache.
FIRST_CACHE_LENGTH = 16
# The most output tokens a search may add to its source (max_extra_length; generate's
# max_new_tokens). The sinusoidal positional encoding has no last position, so the model sets no
# bound: this one stops a mistyped value (10**9 would build a position table and token buffers of
# billions of rows, and fail minutes later, out of memory) before anything is read or compiled.
# 4,096 is 16 times the longest rows the shipped configs train on (wmt14's data.max_length, 256).
MAX_EXTRA_LENGTH = 4096
# The largest sampling seed (Translator's, LanguageModel's, the commands' --seed): jax.random.key
# keeps a seed's low 32 bits (jax_enable_x64 is off), so 2**32 would sample as 0 does and -1 as
# 2**32 - 1, and 2**63 and up fail with an OverflowError.
MAX_SEED = 2**32 - 1


def check_seed(seed: Any) -> None:
    """A ValueError naming `seed` unless it is an integer from 0 to MAX_SEED, one seed a key."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")


def check_rng(rng: Any) -> None:
    """A TypeError naming `rng` unless it is None or a random key: jax.random.key(seed)'s, or
    jax.random.PRNGKey(seed)'s raw uint32 data ([2] for threefry). A seed given in its place (an int, numpy or jax
    scalar) failed in jax.random.split ("invalid PRNG key data: expected key_data.ndim >= 1"),
    naming nothing. Seeds are ints only where a class keeps the key (Translator's and
    LanguageModel's `seed`); the pure functions take the key, as jax's do. Shape and dtype are
    static: traced keys are checked too."""
    if rng is None:
        return
    dtype = getattr(rng, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return
    if dtype is not None and np.dtype(dtype) == np.uint32 and np.ndim(rng) == 1:  # jax.random.PRNGKey's raw data
        return
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        raise TypeError(f"rng must be a random key, got the int {rng}: pass jax.random.key({rng})")
    given = type(rng).__name__ if dtype is None else f"an array of dtype {np.dtype(dtype)}, shape {np.shape(rng)}"
    raise TypeError(f"rng must be a random key, got {given}: pass jax.random.key(seed)")


# The least value of each integer option of Translator and LanguageModel: a piece of at most one
# token would hold no source token besides its EOS, and a bucket or batch of 0 divides by zero.
OPTION_MINIMUMS = {"batch_size": 1, "length_bucket": 1, "max_source_tokens": 2, "parallel_batches": 1}


def check_options(options: dict[str, Any]) -> None:
    """A ValueError naming the first of Translator's or LanguageModel's keyword `options` (as given)
    that they cannot run with; `from_workdir` checks them before anything is read."""
    for name, value in options.items():
        minimum = OPTION_MINIMUMS.get(name)
        if minimum is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if options.get("max_source_tokens", 0) > MAX_SOURCE_TOKENS:
        raise ValueError(
            f"max_source_tokens must be at most {MAX_SOURCE_TOKENS} (longer lines are translated in pieces), "
            f"got {options['max_source_tokens']}"
        )
    if "max_buffer_growth" in options and not options["max_buffer_growth"] >= 1:
        raise ValueError(f"max_buffer_growth must be >= 1, got {options['max_buffer_growth']}")
    if "seed" in options:
        check_seed(options["seed"])


# Sampling divides float32 logits by the temperature: one that float32 cannot hold (1e39) is cast to
# inf, with numpy's overflow warning, and every token is then drawn alike.
TEMPERATURE_RULE = f"a finite number > 0 that float32 holds (at most {float(np.finfo(np.float32).max):.8g})"


def is_valid_temperature(value: Any) -> bool:
    """Whether the number `value` is a temperature TEMPERATURE_RULE allows: > 0, finite in float32
    (NaN not). The one test of DecodeSettings, the --temperature flags and a MarianMT directory's
    temperature (jaxformer/export/export_files.py holds an export's twin of it)."""
    try:
        with np.errstate(over="ignore"):  # the cast that overflows is the question, not a warning
            return bool(value > 0 and np.isfinite(np.float32(value)))
    except OverflowError:  # an integer beyond every float (10**400, which a JSON file can hold)
        return False


# The type each DecodeSettings field must have (checked before its range): a float or a string
# there fails inside jit with a JAX TypeError, a bool passes as 0 or 1.
_FIELD_KINDS: dict[str, Any] = {
    "method": str,
    "beam_size": int,
    "alpha": (int, float),
    "length_penalty": str,
    "max_extra_length": int,
    "stop": str,
    "temperature": (int, float),
    "top_k": int,
    "renormalize_after_bans": bool,
}

# The DecodeSettings fields of a beam or greedy search, all but sampling's (temperature, top_k):
# what a validation score, a final choice and the alpha it kept depend on of the search.
SEARCH_FIELDS = ("method", "beam_size", "alpha", "length_penalty", "max_extra_length", "stop", "renormalize_after_bans")


# Its __post_init__ checks each field's type itself, with the one-line ValueError a flag's value
# gets: no_type_check keeps the tests' jaxtyping hook (tests/conftest.py) from raising first.
@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """How to search. Beam 4, alpha 0.6 and output <= input + 50 are the paper's; the stop rule is
    transformers' default (stop="exact" is the search the paper's tensor2tensor code runs)."""

    method: str = "beam"  # "beam", "greedy" or "sample"
    beam_size: int = 4
    alpha: float = 0.6  # length penalty ((5 + |Y|) / 6)^alpha
    # The length penalty's form: "gnmt", ((5 + |Y|) / 6)^alpha, or "transformers", |Y|^alpha (beam_search.py).
    length_penalty: str = "gnmt"
    max_extra_length: int = 50  # output tokens (EOS included) <= source tokens + this
    # When beam search stops a sentence: "exact", "current_length" or "beam_full" (beam_search.py).
    # current_length, transformers' default, scored as exact did on Multi30k's validation split, in
    # a fifth less time (README, "Translation").
    stop: str = "current_length"
    temperature: float = 1.0  # sampling only
    top_k: int = 0  # sampling only; 0 = the whole vocabulary
    # Each step's log-probabilities normalised over the tokens the search allows there (pad, BOS and,
    # at a row's limit, all but EOS removed before the softmax), as transformers' generate scores with
    # renormalize_logits=True (a --from_hf import of a model that sets it). False: log p under the model.
    renormalize_after_bans: bool = False

    def __post_init__(self):
        set_python_scalar_fields(self)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind = _FIELD_KINDS[field.name]
            # True would be a beam of 1; 1 a switch turned on
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
                expected = {str: "a string", int: "an integer", (int, float): "a number", bool: "True or False"}[kind]
                raise ValueError(f"{field.name} must be {expected}, got {value!r}")
        if self.method not in METHODS:
            raise ValueError(f"decoding method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.length_penalty not in LENGTH_PENALTIES:
            raise ValueError(f"length penalty {self.length_penalty!r}: choose one of {', '.join(LENGTH_PENALTIES)}")
        if self.stop not in BEAM_STOPS:
            raise ValueError(f"beam stop rule {self.stop!r}: choose one of {', '.join(BEAM_STOPS)}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.max_extra_length <= MAX_EXTRA_LENGTH:
            raise ValueError(f"max_extra_length must be from 1 to {MAX_EXTRA_LENGTH}, got {self.max_extra_length}")
        if not is_valid_alpha(self.alpha):
            raise ValueError(f"alpha must be {ALPHA_RULE}, got {self.alpha}")
        if not is_valid_temperature(self.temperature):
            raise ValueError(f"temperature must be {TEMPERATURE_RULE}, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: the whole vocabulary), got {self.top_k}")

    def check_fits(self, config: TransformerConfig) -> None:
        """A ConfigError when these settings ask `config`'s model for more than it has (a flag's
        value, which the commands print in one line): checked before any parameter is read."""
        if self.method == "sample" and self.top_k > config.vocab_size:
            raise ConfigError(
                f"top_k={self.top_k} is more than the model's {config.vocab_size} tokens: "
                "top_k=0 samples from all of them"
            )
        if self.method == "beam" and self.beam_size > config.vocab_size:
            raise ConfigError(
                f"beam_size={self.beam_size} is more than the model's {config.vocab_size} tokens: a beam keeps "
                "distinct hypotheses, and the first step has only that many"
            )

    @property
    def hypotheses(self) -> int:
        """Hypotheses returned per source row."""
        return self.beam_size if self.method == "beam" else 1


def decoding_variant(config: TransformerConfig, params: Any) -> tuple[TransformerConfig, Any]:
    """The inference form of a model: no dropout, no remat, unscanned layers (cached decoding
    steps through the layers one at a time)."""
    if config.scan_layers:
        params = unstack_layers(params)
    return config.replace(deterministic=True, scan_layers=False, remat_policy="none"), params


# What every search returns: K hypotheses per row (tokens ending in EOS, then padding) and their scores.
Hypotheses = tuple[Int[Array, "B K L"], Float[Array, "B K"]]


def output_limits(source_lengths: Int[Array, B], max_extra_length: int, max_positions: int | None) -> Int[Array, B]:
    """The most output tokens (EOS included) of each row: its real source tokens + max_extra_length,
    and no more than the model's positions (`TransformerConfig.max_positions`, None: no bound), the
    decoder's input (BOS and the tokens before the last) taking one position per output token."""
    limits = source_lengths + max_extra_length
    return limits if max_positions is None else jnp.minimum(limits, max_positions)


def generate(
    model: Transformer, params: Any, source: Int[Array, "B S"], settings=DecodeSettings(), rng: jax.Array | None = None
) -> Hypotheses:
    """Translates padded source rows: (tokens [B, K, L] ending in EOS then padding, scores [B, K]).

    L = S + settings.max_extra_length (at most the model's max_positions); row b ends by `output_limits`
    (its real source tokens + max_extra_length, at most max_positions) output tokens, EOS included,
    and never outputs pad or BOS. Beam search gives K = beam_size
    hypotheses best first, scored log p(Y) / length_penalty(|Y|); greedy and sampling give K = 1
    with log p(Y). Every score is what the model's full forward pass gives for Y, hypotheses
    ended at the limit included (see jaxformer/decoding/search.py); with
    settings.renormalize_after_bans, log p(Y) sums each step's log-probabilities over the tokens
    allowed there. `model` must be the decoding variant (`decoding_variant`).
    """
    check_rng(rng)  # before the encoder runs
    batch, source_length = source.shape
    max_length, max_positions = source_length + settings.max_extra_length, model.config.max_positions
    if max_positions is not None:  # the rows' limits are no longer; a symbolic S (an export) gets min(S + extra, P)
        max_length = jax.core.min_dim(max_length, max_positions)
    context = model.apply({"params": params}, source, method=Transformer.encoder_context)
    source_lengths = jnp.sum(source != PAD_ID, axis=1, dtype=jnp.int32)
    limits = output_limits(source_lengths, settings.max_extra_length, max_positions)  # [B], <= max_length
    growth = None
    if not jax.export.is_symbolic_dim(max_length):  # an exported program keeps one full-length cache
        growth = CacheGrowth.doubling(FIRST_CACHE_LENGTH, max_length, lambda cache, length: cache.grown(length))
    spec = SearchSpec(
        batch, max_length, BOS_ID, EOS_ID, limits=limits, banned_ids=(PAD_ID, BOS_ID), cache_growth=growth
    )

    def tokens_to_logits(tokens, cache):  # [R, 1] -> [R, V]
        return model.apply({"params": params}, tokens, cache, context, method=Transformer.decode_step)

    cache_length = max_length if growth is None else growth.lengths[0]
    return search(tokens_to_logits, init_cache(model.config, batch, cache_length), spec, settings, rng)


def search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    spec: SearchSpec,
    settings: DecodeSettings,
    rng: jax.Array | None = None,
) -> Hypotheses:
    """The search `settings.method` names over `tokens_to_logits`, hypotheses [B, K, ...] always
    (K = 1 for greedy search and sampling); `cache` has one row per batch row (beam search
    repeats it per beam). `spec`'s renormalize_after_bans is the settings'. `rng`: sampling's key
    (None: jax.random.key(0)), a seed refused (`check_rng`)."""
    check_rng(rng)
    spec = dataclasses.replace(spec, renormalize_after_bans=settings.renormalize_after_bans)
    if settings.method == "beam":
        return beam_search(
            tokens_to_logits, cache, spec, settings.beam_size, settings.alpha, settings.length_penalty, settings.stop
        )
    if settings.method == "greedy":
        tokens, scores = greedy_search(tokens_to_logits, cache, spec)
    else:
        rng = jax.random.key(0) if rng is None else rng
        tokens, scores = sample_search(tokens_to_logits, cache, spec, rng, settings.temperature, settings.top_k)
    return tokens[:, None], scores[:, None]


def check_source_ids(source: Any, vocab_size: int, max_positions: int | None = None) -> None:
    """A ValueError naming the first id of a concrete (numpy or jax) `source` [B, S] outside
    [0, vocab_size): the model would give that row NaN logits (or, below 0, the last embedding);
    or the first PAD before a row's last id (a row of PAD alone is a batch's filler, and passes);
    or the first row whose ids before its padding are more than the model's `max_positions` (None:
    no bound; an imported model's): the encoder would read positions the model never had, without
    a word. A jax.Array is copied to the host to be checked (which waits for what computes it);
    traced arrays are not checked: nothing inside a jitted program can raise."""
    if isinstance(source, jax.core.Tracer) or not isinstance(source, (np.ndarray, jax.Array)):
        return
    if isinstance(source, jax.Array) and not source.is_fully_addressable:
        return  # another process holds part of it
    ids = np.asarray(source)
    if ids.ndim != 2 or ids.size == 0:
        return
    if ids.min() < 0 or ids.max() >= vocab_size:
        row, position = np.argwhere((ids < 0) | (ids >= vocab_size))[0]
        raise ValueError(
            f"source id {ids[row, position]} at row {row}, position {position} is outside the model's source "
            f"vocabulary [0, {vocab_size})"
        )
    real = ids != PAD_ID
    # PAD before a row's last id (left padding, or a gap): the encoder's mask drops it, and the ids after
    # it are encoded at positions shifted by it, so the row translated otherwise than unpadded, without a word.
    inside = ~real & np.flip(np.logical_or.accumulate(np.flip(real, axis=1), axis=1), axis=1)
    if inside.any():
        row, position = np.argwhere(inside)[0]
        raise ValueError(
            f"source row {row} has PAD ({PAD_ID}) at position {position}, before its last id at position "
            f"{ids.shape[1] - 1 - np.argmax(real[row, ::-1])}: padding goes only after a row's ids"
        )
    if max_positions is None or ids.shape[1] <= max_positions:
        return
    # Each row's ids up to its last that is not PAD: the padding after them is masked, not encoded.
    lengths = np.where((ids != PAD_ID).any(axis=1), ids.shape[1] - np.argmax(ids[:, ::-1] != PAD_ID, axis=1), 0)
    if (lengths > max_positions).any():
        row = int(np.argmax(lengths > max_positions))
        raise ValueError(
            f"source row {row} has {lengths[row]} ids before its padding, more than the model's {max_positions} "
            "positions (model.max_positions): give it in pieces of at most that many, as translate splits a "
            "longer sentence"
        )


def checked_source(source: Any, vocab_size: int, max_positions: int | None = None) -> Any:
    """`source` as the search takes it, int32 ids [B, S]: any integer dtype is cast; another rank
    or an empty dimension is a ValueError, a bool, float or other dtype a TypeError, each one line
    naming the shape or dtype given. Concrete ids are checked against `vocab_size` and each row's
    length against `max_positions` too (`check_source_ids`): a jax.Array's are copied to the host for
    it, a wait that costs less than a batch of NaN rows found later; a tracer's shape and dtype only
    (nothing inside a jitted program can raise)."""
    on_device = isinstance(source, jax.Array)
    if not on_device:
        try:
            source = np.asarray(source)
        except ValueError:  # a ragged list
            raise ValueError("source must be ids [batch, length]: got rows of different lengths") from None
    shape, dtype = tuple(source.shape), np.dtype(source.dtype)
    if len(shape) != 2:
        hint = ": for one sentence's ids pass source[None]" if len(shape) == 1 and source.size else ""
        raise ValueError(f"source must be ids [batch, length] (2-D), got shape {shape}{hint}")
    # Before the dtype: numpy makes [[]] float64. No rows fails in the decoder's step (a division
    # by the batch size), rows of no ids in the attention's softmax: neither says what was given.
    empty = [name for name, size in zip(("batch", "length"), shape) if size == 0]
    if empty:
        raise ValueError(
            f"source has shape {shape}, its {' and '.join(empty)} dimension{'s' * (len(empty) > 1)} empty: "
            "ids [batch, length] need at least one row, each a sentence's ids ending with EOS"
        )
    if dtype == np.bool_ or not np.issubdtype(dtype, np.integer):
        raise TypeError(f"source ids must be integers, got dtype {dtype} (shape {shape})")
    check_source_ids(source, vocab_size, max_positions)  # on the integers given: a cast could wrap a huge id into range
    if on_device:
        return source if dtype == np.int32 else source.astype(jnp.int32)
    return source.astype(np.int32, copy=False)


class GenerateFn:
    """`make_generate_fn`'s result: the jitted search, called on `checked_source(source)`;
    `trace` and `lower` are the jitted function's (so `jax.export.export` takes it)."""

    def __init__(self, jitted: Any, source_vocab_size: int, max_positions: int | None = None):
        self.jitted, self.source_vocab_size, self.max_positions = jitted, source_vocab_size, max_positions
        self.trace, self.lower = jitted.trace, jitted.lower

    def __call__(self, params: Any, source: Any, rng: jax.Array | None = None) -> Hypotheses:  # source: ids [B, S]
        check_rng(rng)  # before the trace, where its value is still known
        return self.jitted(params, checked_source(source, self.source_vocab_size, self.max_positions), rng)


def make_generate_fn(config: TransformerConfig, settings: DecodeSettings = DecodeSettings()) -> GenerateFn:
    """`jit(lambda params, source, rng: generate(...))` for the decoding variant of `config`;
    pass parameters already in the decoding form (`decoding_variant`). `source` is checked and
    cast to int32 first (`checked_source`: its shape, dtype, concrete ids and their rows' lengths)."""
    if config.architecture != "encoder_decoder":
        instead = (
            " (a decoder_only model continues prompts: continue_prompts or LanguageModel, "
            "jaxformer/decoding/language_model.py)"
            if config.architecture == "decoder_only"
            else ""
        )
        found = config.architecture
        raise ConfigError(
            f"make_generate_fn translates with an encoder_decoder model, not architecture={found!r}{instead}"
        )
    model = Transformer(config)

    def generate_fn(params, source, rng=None):
        return generate(model, params, source, settings, rng)

    return GenerateFn(jax.jit(generate_fn), config.encoder_vocab_size, config.max_positions)
