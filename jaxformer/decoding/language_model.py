"""Continuing prompts with a decoder-only model: the prompt through the KV cache, then the same
greedy, sampling or beam search as translation (search.py, beam_search.py), greedy unless told otherwise.

`continue_prompts(model, params, prompts, settings, rng)` is a pure, jittable function of arrays;
`LanguageModel` is text in, text out, from a training workdir.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.data.tokenizer import WORD_BOUNDARY, Tokenizer
from jaxformer.decoding.generate import DecodeSettings, Hypotheses, check_options, check_rng, decoding_variant, search
from jaxformer.decoding.option_names import check_option_names
from jaxformer.decoding.progress_bar import progress_bar
from jaxformer.decoding.search import SearchSpec
from jaxformer.decoding.sentence_batches import sentence_list
from jaxformer.errors import CheckpointError
from jaxformer.model.cache import DecoderCache, init_cache
from jaxformer.model.config import TransformerConfig
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.run.architecture_uses import refuse_another_model
from jaxformer.run.directory import RunDirectory, checkpoint_name, parse_checkpoint_choice
from jaxformer.run.loading import (
    LANGUAGE_MODEL_MAKES_NONE,
    language_model_keeps_none,
    load_checkpoint,
    require_architecture,
)
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID
from jaxformer.typing import Array, Bool, Float, Int

logger = logging.getLogger(__name__)

# The search a continuation gets unless the caller gives another: greedy, as transformers' generate
# and jaxformer-generate do. Translation's default, beam 4, favours dull, repetitive continuations
# of open-ended text (Holtzman et al., 2020); beam and sampling are a DecodeSettings(method=...) away.
# Up to as many new tokens as jaxformer-generate's --max_new_tokens adds by default, so the Python
# API and the command continue a prompt alike.
CONTINUATION_TOKENS = 30
CONTINUATION_SETTINGS = DecodeSettings(method="greedy", max_extra_length=CONTINUATION_TOKENS)


# Ids no text encodes to (control pieces), which a prompt, the start of a text, cannot hold: the
# decoder learnt from BOS, a text, EOS, then PAD, so a prompt holding one would be continued as
# input it never learnt from (after EOS, a text has ended: what follows is no continuation of it).
NOT_IN_A_PROMPT = {EOS_ID: "EOS", BOS_ID: "BOS", PAD_ID: "PAD"}


def refuse_other_than_a_prompt(ids: np.ndarray, vocab_size: int, name: str) -> None:
    """A one-line error naming `name` (and the position) for ids that are not a prompt's: not 1-D,
    not integers (a bool or float would be cast when the rows are stacked), an id outside
    [0, vocab_size) (NaN logits, or below 0 the last embedding), or EOS, BOS or PAD anywhere
    (`NOT_IN_A_PROMPT`). A prompt is a text's ids without the EOS that ends it (`encode(text,
    add_eos=False)`), so EOS at its end is refused too; an empty prompt is unconditional generation."""
    if ids.ndim != 1:
        raise ValueError(f"{name} must be one prompt's ids (1-D), got shape {ids.shape}")
    if ids.size and (ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer)):  # [] is float64
        raise TypeError(f"{name}'s ids must be integers, got dtype {ids.dtype}")
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if outside.size:
        raise ValueError(
            f"{name}: id {ids[outside[0]]} at position {outside[0]} is outside the model's vocabulary [0, {vocab_size})"
        )
    special = np.flatnonzero(np.isin(ids, list(NOT_IN_A_PROMPT)))
    if special.size:
        position = int(special[0])
        label = NOT_IN_A_PROMPT[int(ids[position])]
        raise ValueError(
            f"{name} has {label} ({ids[position]}) at position {position}: a prompt is the start of a text, its "
            f"ids without the EOS ({EOS_ID}) that ends it, and holds no EOS, BOS ({BOS_ID}) or PAD ({PAD_ID})"
        )


def checked_prompts(prompts: Sequence[Any] | np.ndarray, vocab_size: int) -> list[np.ndarray]:
    """`prompts` as int32 arrays, one per prompt, each checked (`refuse_other_than_a_prompt`) with
    errors naming its index in `prompts`, before anything is compiled."""
    if isinstance(prompts, (np.ndarray, jax.Array)) and np.ndim(prompts) == 1:
        raise TypeError(f"prompts must be a list of id sequences, not one of shape {np.shape(prompts)}: pass [ids]")
    arrays = [np.asarray(prompt) for prompt in prompts]
    for index, ids in enumerate(arrays):
        refuse_other_than_a_prompt(ids, vocab_size, f"prompt {index}")
    return [ids.astype(np.int32, copy=False) for ids in arrays]


def check_prompt_rows(prompts: Any, vocab_size: int) -> None:
    """Each row of concrete (numpy or jax) `prompts` [B, P] checked as a prompt, errors naming the
    row; prompts in anything but an array (a nested list) are a TypeError. A jax.Array is copied to
    the host for it; traced arrays, and one that another process holds part of, are not checked
    (nothing inside a jitted program can raise)."""
    if isinstance(prompts, jax.core.Tracer):
        return
    if not isinstance(prompts, (np.ndarray, jax.Array)):  # a nested list failed at prompts.shape, naming nothing
        raise TypeError(
            f"prompts must be ids [batch, length] in an array, got a {type(prompts).__name__}: "
            "pass jnp.asarray(prompts)"
        )
    if isinstance(prompts, jax.Array) and not prompts.is_fully_addressable:
        return
    rows = np.asarray(prompts)
    if rows.ndim != 2:
        raise ValueError(f"prompts must be ids [batch, length], got shape {rows.shape}")
    for row, ids in enumerate(rows):
        refuse_other_than_a_prompt(ids, vocab_size, f"prompt row {row}")


def loses_its_word_break(prompt: str, ids: np.ndarray, tokenizer: Tokenizer) -> bool:
    """Whether `prompt` ends in whitespace that its `ids` do not hold. Sentencepiece drops a text's
    trailing whitespace, so "A dog runs " encodes as "A dog runs" does, and a model continuing
    those ids would go on with the word "runs" where the prompt asked for a new one."""
    return prompt[-1:].isspace() and not tokenizer.decode(ids)[-1:].isspace()


class PromptedCache(NamedTuple):
    """The search's cache: the decoder's, with the prompt already in it, and each row's last
    prompt token, which the first search step reads instead of the search's BOS."""

    decoder: DecoderCache
    last_prompt_tokens: Int[Array, "R 1"]
    started: jax.Array  # bool []: the first step has been taken


def continue_prompts(
    model: DecoderOnly,
    params: Any,
    prompts: Int[Array, "B P"],
    settings=CONTINUATION_SETTINGS,
    rng: jax.Array | None = None,
    first_banned: Bool[Array, "B V"] | None = None,
) -> Hypotheses:
    """Continuations of prompt rows of equal length P (no padding; P may be 0): (tokens [B, K, L]
    with L = settings.max_extra_length, ending in EOS then padding, or cut at N tokens as they
    stand; scores [B, K], log p of the continuation, divided by the length penalty for beam
    search). The decoder reads BOS, the prompt, then the continuation; row b's continuation starts
    with no token `first_banned[b]` marks, but may start with EOS (`LanguageModel` bans the pieces
    that go on with the prompt's last word after a prompt that ended in a space). `model` must be
    the decoding variant (`decoding_variant`). Concrete prompts are checked first
    (`check_prompt_rows`); inside a caller's own `jax.jit` nothing can raise, so there only their
    shape counts."""
    check_prompt_rows(prompts, model.config.vocab_size)
    check_rng(rng)  # before the prompts fill the cache
    batch, prompt_length = prompts.shape
    new_tokens = settings.max_extra_length
    decoder_inputs = jnp.concatenate([jnp.full((batch, 1), BOS_ID, prompts.dtype), prompts], axis=1)  # [B, P + 1]

    def step(tokens, cache):  # [R, 1] -> [R, V]
        return model.apply({"params": params}, tokens, cache, method=DecoderOnly.decode_step)

    def prefill(cache: DecoderCache, tokens: Int[Array, B]) -> tuple[DecoderCache, None]:
        return step(tokens[:, None], cache)[1], None

    cache = init_cache(model.config, batch, prompt_length + new_tokens)
    cache, _ = jax.lax.scan(prefill, cache, decoder_inputs[:, :-1].T)  # BOS and all but the last prompt token
    prompted = PromptedCache(cache, decoder_inputs[:, -1:], jnp.zeros((), bool))

    def tokens_to_logits(tokens: Int[Array, "R 1"], cache: PromptedCache) -> tuple[Float[Array, "R V"], PromptedCache]:
        tokens = jnp.where(cache.started, tokens, cache.last_prompt_tokens)
        logits, decoder = step(tokens, cache.decoder)
        return logits, PromptedCache(decoder, cache.last_prompt_tokens, jnp.ones((), bool))

    # No length limits: a continuation that reaches N tokens is cut there, without EOS.
    spec = SearchSpec(batch, new_tokens, BOS_ID, EOS_ID, banned_ids=(PAD_ID, BOS_ID), first_banned=first_banned)
    return search(tokens_to_logits, prompted, spec, settings, rng)


NEEDS_A_LANGUAGE_MODEL = "a LanguageModel (jaxformer-generate) continues text with a decoder_only one"


def check_kept_by_a_language_model(workdir: str | os.PathLike, checkpoint: str | int) -> None:
    """A `CheckpointError` for "best" or "final" where `workdir` has none, which no language model's
    run has (`LANGUAGE_MODEL_MAKES_NONE`), naming what to choose (a `ConfigError` first where the
    workdir holds another model's run); before anything else of the checkpoint is read, as
    jaxformer-generate reads final/'s search to settle its flags."""
    if checkpoint in LANGUAGE_MODEL_MAKES_NONE and not RunDirectory(workdir).checkpoint_directory(checkpoint).is_dir():
        require_architecture(workdir, "latest", "decoder_only", NEEDS_A_LANGUAGE_MODEL)
        raise CheckpointError(f"{workdir} has no {checkpoint!r} checkpoint: {language_model_keeps_none(checkpoint)}")


class LanguageModel:
    """Continues prompts (text) with a decoder-only model, by greedy search unless `settings` say
    otherwise. Prompts are grouped by token count, so rows need no padding; `batch_size` rows at a
    time, each group length compiled once (twice where a batch holds a prompt that ended in a
    space, whose continuation starts a new word)."""

    def __init__(
        self,
        config: TransformerConfig,
        params: Any,
        tokenizer: Tokenizer,
        settings: DecodeSettings = CONTINUATION_SETTINGS,
        *,
        batch_size: int = 64,
        seed: int = 0,
    ):
        refuse_another_model(config, "decoder_only", "LanguageModel")
        if config.vocab_size != tokenizer.vocab_size:
            raise ValueError(f"the model has {config.vocab_size} tokens, its tokenizer {tokenizer.vocab_size}")
        # As Translator checks them: a batch of 0 fails in range() at the first prompt, and one below
        # 0 continues no prompt at all (complete_nbest gave None for each).
        check_options({"batch_size": batch_size, "seed": seed})
        settings.check_fits(config)
        self.config, self.params = decoding_variant(config, jax.device_put(params))
        self.tokenizer, self.settings, self.batch_size = tokenizer, settings, batch_size
        model = DecoderOnly(self.config)
        # The pieces that would go on with a prompt's last word, once per vocabulary; None where the
        # tokenizer marks no word starts (then a prompt's trailing space changes nothing).
        word_starts = tokenizer.word_starts
        self._goes_on_with_a_word = None if word_starts is None else jnp.asarray(~word_starts)

        def continue_rows(params, prompts, rng, new_words):  # new_words: bool [B], or None for no row
            banned = None if new_words is None else new_words[:, None] & self._goes_on_with_a_word[None, :]
            return continue_prompts(model, params, prompts, settings, rng, banned)

        self._continue = jax.jit(continue_rows)
        self._rng = jax.random.key(seed)

    @classmethod
    def from_workdir(
        cls,
        workdir: str | os.PathLike,
        checkpoint: str | int = "latest",
        settings: DecodeSettings = CONTINUATION_SETTINGS,
        **kwargs,
    ) -> LanguageModel:
        """The model and tokenizer of a decoder-only training run's `checkpoint`, read once. A
        `ConfigError` naming the workdir, before any parameter is read, when its model is of another
        architecture; a `CheckpointError` for "best" or "final" where the run has none, which no
        language model's run has (`LANGUAGE_MODEL_MAKES_NONE`)."""
        checkpoint = parse_checkpoint_choice(checkpoint)
        check_option_names(kwargs, cls, "LanguageModel.from_workdir")
        check_options(kwargs)  # before anything is read
        check_kept_by_a_language_model(workdir, checkpoint)

        def check(metadata: CheckpointMetadata) -> None:  # from the one read of its metadata, before the parameters
            settings.check_fits(
                require_architecture(workdir, checkpoint, "decoder_only", NEEDS_A_LANGUAGE_MODEL, metadata=metadata)
            )

        step, metadata, params = load_checkpoint(workdir, checkpoint, before_params=check)
        logger.info("loaded step %d of %s (%s)", step, workdir, checkpoint_name(checkpoint))
        return cls(metadata.model_config(), params, metadata.load_tokenizer(), settings, **kwargs)

    def complete(self, prompts: Iterable[str], progress: bool = False) -> list[str]:
        """Each prompt followed by its best continuation, as text."""
        return [hypotheses[0][0] for hypotheses in self.complete_nbest(prompts, progress)]

    def complete_nbest(self, prompts: Iterable[str], progress: bool = False) -> list[list[tuple[str, float]]]:
        """Per prompt, (prompt + continuation as text, score) for each hypothesis, best first. The
        prompt is the caller's text as given (sentencepiece's normalisation, unknown characters and
        runs of spaces left as they were); the continuation follows it as the tokenizer spaces it.
        A prompt that ends in whitespace (which sentencepiece drops) is continued with a new word,
        or nothing: its continuation starts with a piece that begins a word, or with EOS.
        Any iterable of str (a generator, a file's lines), read once before anything is decoded; the
        line break that ends a prompt (a file's line) ends its line, as jaxformer-generate reads lines,
        and is no part of the prompt: kept, it was printed between the prompt and its continuation and
        asked for a new word where the command continues the prompt's last one.
        `progress`: a bar on stderr counting the prompts continued, as `Translator.translate`'s."""
        prompts = [prompt.rstrip("\r\n") for prompt in sentence_list(prompts)]
        encoded = [self.tokenizer.encode(prompt, add_eos=False) for prompt in prompts]
        new_words = [loses_its_word_break(prompt, ids, self.tokenizer) for prompt, ids in zip(prompts, encoded)]
        results: list[Any] = [None] * len(prompts)
        batches = self.continue_ids(encoded, new_words)  # the prompts checked before the bar is drawn
        with progress_bar(len(prompts), "generate", "prompt", progress) as bar:
            for indices, tokens, scores in batches:
                for row, index in enumerate(indices):
                    results[index] = [
                        (
                            prompts[index] + self._continuation(encoded[index], tokens[row, k], prompts[index]),
                            float(score),
                        )
                        for k, score in enumerate(scores[row])
                    ]
                bar.update(len(indices))
        return results

    def _continuation(self, prompt_ids: np.ndarray, continuation_ids: np.ndarray, prompt: str) -> str:
        """The text that `continuation_ids` add after the prompt: the decoded prompt and continuation
        less the decoded prompt, so a continuation that starts a new word brings its space."""
        decoded_prompt = self.tokenizer.decode(prompt_ids)
        decoded = self.tokenizer.decode(np.concatenate([prompt_ids, continuation_ids]))
        if decoded.startswith(decoded_prompt):
            text = decoded[len(decoded_prompt) :]
        else:  # decoding is not prefix-stable at this boundary: the continuation alone, spaced by its first piece
            text = self.tokenizer.decode(continuation_ids)
            first = [int(i) for i in continuation_ids if int(i) not in (PAD_ID, BOS_ID)][:1]
            if (
                prompt
                and text
                and first
                and first[0] != EOS_ID
                and self.tokenizer.pieces(first)[0].startswith(WORD_BOUNDARY)
            ):
                text = " " + text
        if prompt[-1:].isspace() and text[:1] == " ":
            text = text[1:]  # the prompt's own trailing space already separates the new word
        return text

    def continue_ids(
        self, prompts: Sequence[np.ndarray | Sequence[int]] | np.ndarray, new_words: Sequence[bool] | None = None
    ) -> Iterator[tuple[list[int], Any, Any]]:
        """(prompt indices, tokens [b, K, L], scores [b, K]) per batch of equal-length prompts, each
        prompt a text's ids without EOS (`checked_prompts`: checked when called, errors naming its
        index in `prompts`, before anything is compiled). Where `new_words[i]` is true (prompt i's
        text ended in a space its ids lost: `loses_its_word_break`), the continuation starts with a
        piece that begins a word, or with EOS."""
        checked = checked_prompts(prompts, self.config.vocab_size)
        if new_words is None:
            new_words = [False] * len(checked)
        new_words = [bool(flag) for flag in new_words]
        if len(new_words) != len(checked):
            raise ValueError(f"new_words has {len(new_words)} flags for {len(checked)} prompts: give one per prompt")
        if self._goes_on_with_a_word is None:  # no word starts to choose among
            new_words = [False] * len(checked)
        return self._continued_batches(checked, new_words)

    def _continued_batches(
        self, prompts: list[np.ndarray], new_words: list[bool]
    ) -> Iterator[tuple[list[int], Any, Any]]:
        by_length: dict[int, list[int]] = {}
        for index, prompt in enumerate(prompts):
            by_length.setdefault(len(prompt), []).append(index)
        for length, indices in sorted(by_length.items()):
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                rows = np.stack([prompts[i] for i in chunk]).reshape(len(chunk), length).astype(np.int32)
                self._rng, rng = jax.random.split(self._rng)
                # None where no row needs it: such batches run the program they ran before, unchanged.
                flags = np.array([new_words[i] for i in chunk]) if any(new_words[i] for i in chunk) else None
                tokens, scores = jax.device_get(self._continue(self.params, rows, rng, flags))
                yield chunk, tokens, scores
