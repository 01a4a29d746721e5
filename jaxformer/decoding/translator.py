"""`Translator`: text in, text out, from a training workdir or from parameters in memory."""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decoding import sentence_batches
from jaxformer.decoding.checkpoint_alpha import ChosenSearch, checkpoint_search
from jaxformer.decoding.generate import DecodeSettings, check_options, decoding_variant, make_generate_fn
from jaxformer.decoding.option_names import check_option_names
from jaxformer.decoding.progress_bar import progress_bar
from jaxformer.model.config import ConfigError, TransformerConfig
from jaxformer.model.transformer import unstack_layers
from jaxformer.run.architecture_uses import refuse_another_model
from jaxformer.run.directory import checkpoint_name, parse_checkpoint_choice
from jaxformer.run.loading import NEEDS_A_TRANSLATOR, load_checkpoint, require_architecture
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.tokens import EOS_ID, PAD_ID

logger = logging.getLogger(__name__)


def _as_loaded(params: Any) -> Any:
    """Parameters that all live on the default device, placed there as `from_workdir` places
    loaded ones (others as they are). A training loop's parameters carry its mesh's sharding
    even on one device, which makes the search another program than for parameters loaded from
    a checkpoint: the persistent compilation cache would not serve translate.py what the run's
    final choice compiled."""
    leaves = jax.tree.leaves(params)
    if not leaves or not all(isinstance(leaf, jax.Array) for leaf in leaves):
        return params
    if {device for leaf in leaves for device in leaf.sharding.device_set} != {jax.devices()[0]}:
        return params
    return jax.device_put(jax.device_get(params))


class Translator:
    """Translates lists of sentences with a trained model.

    Sentences are tokenized, sorted by length and decoded in batches of `batch_size` rows
    whose source length is rounded up to a multiple of `length_bucket`, or to a longer length
    the search was compiled for already when that makes the search's buffer (source length +
    max_extra_length) at most `max_buffer_growth` times longer: a new shape costs a compilation
    of the whole search, a longer buffer costs every step of the batch (see
    `sentence_batches.padded_length`; 1.0 pads each batch to its own bucket). The search lets
    neither the padding nor the other sentences of a batch change a sentence's result; the
    arithmetic moves float32 scores by up to about 4e-4 of their size with the batch's shape, which can
    turn a near-tie, and bfloat16 operands (`matmul_dtype`, `dtype`) round to 8 bits (README, "Translation");
    sampling draws from one key per batch, so a sampled sentence depends on its batch. Results come back
    in input order. Empty input gives empty output. A sentence longer than `max_source_tokens`
    is translated in pieces (at sentence ends where it can) joined by spaces, so nothing is
    dropped. `parallel_batches` batches are decoded at once, from as many threads: on a CPU one
    search leaves cores idle (its top-k and beam reordering run on one core), and the batches'
    results do not depend on each other.
    """

    def __init__(
        self,
        config: TransformerConfig,
        params: Any | None,
        tokenizer: Tokenizer,
        settings: DecodeSettings = DecodeSettings(),
        *,
        batch_size: int = 32,
        length_bucket: int = 16,
        max_buffer_growth: float = 1.25,
        max_source_tokens: int | None = None,
        target_tokenizer: Tokenizer | None = None,
        parallel_batches: int = 2,
        seed: int = 0,
    ):
        refuse_another_model(config, "encoder_decoder", "Translator")
        # `tokenizer` encodes the input; `target_tokenizer` (separate vocabularies) decodes the output.
        target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
        for side, model_size, side_tokenizer in (
            ("source", config.encoder_vocab_size, tokenizer),
            ("target", config.vocab_size, target_tokenizer),
        ):
            if model_size != side_tokenizer.vocab_size:
                raise ValueError(
                    f"the model's {side} vocabulary has {model_size} tokens, its tokenizer {side_tokenizer.vocab_size}"
                )
        check_options(
            dict(
                batch_size=batch_size,
                length_bucket=length_bucket,
                **({} if max_source_tokens is None else {"max_source_tokens": max_source_tokens}),
                max_buffer_growth=max_buffer_growth,
                parallel_batches=parallel_batches,
                seed=seed,
            )
        )
        settings.check_fits(config)
        self.config, _ = decoding_variant(config, {})
        self.params = None if params is None else decoding_variant(config, jax.device_put(params))[1]
        self.scanned = config.scan_layers
        self.tokenizer, self.target_tokenizer = tokenizer, target_tokenizer
        self.settings = settings
        # A model with a last position (an imported MarianMT model's) never reads a source past it.
        max_source_tokens = source_token_limit(max_source_tokens, config)
        self.batch_size, self.length_bucket, self.max_source_tokens = batch_size, length_bucket, max_source_tokens
        self.max_buffer_growth = max_buffer_growth
        self.parallel_batches = parallel_batches
        self._generate = make_generate_fn(self.config, settings)
        self._compiled_lengths: set[int] = set()  # shared with with_params' copies, as _generate is
        self._rng = jax.random.key(seed)  # sampling's: one key per batch, split from it in turn
        self.step: int | None = None  # the checkpoint's step, when loaded from a workdir

    @property
    def compiled_lengths(self) -> list[int]:
        """The source lengths the search has been compiled for so far (batches are padded to them)."""
        return sorted(self._compiled_lengths)

    def with_params(self, params: Any) -> Translator:
        """The same translator (and compiled search) with other parameters of the same model,
        e.g. the train state's during training."""
        translator = copy.copy(self)
        translator.params = _as_loaded(unstack_layers(params) if self.scanned else params)
        return translator

    def with_settings(self, settings: DecodeSettings) -> Translator:
        """The same translator and parameters searching with other settings (another compiled search)."""
        translator = copy.copy(self)
        translator.settings = settings
        translator._generate = make_generate_fn(self.config, settings)
        translator._compiled_lengths = set()  # the lengths the new search has been compiled for
        return translator

    @classmethod
    def from_workdir(
        cls,
        workdir: str | os.PathLike,
        checkpoint: str | int = "latest",
        settings: DecodeSettings | None = None,
        *,
        chosen: ChosenSearch | None = None,
        settle_search: Callable[[ChosenSearch | None], DecodeSettings] | None = None,
        loaded: tuple[int, CheckpointMetadata, Any] | None = None,
        tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
        **kwargs,
    ) -> Translator:
        """The model, tokenizers and parameters of a training run's `checkpoint` ("latest",
        "best", "averaged", "final" or a step number; see `jaxformer.run.loading.load_checkpoint`).
        Without `settings`, DecodeSettings() with, on "final", the search the run's final choice was
        made with (its method, beam size, stop rule, ...) and the length penalty alpha it kept
        (training.final_alphas), as translate, evaluate and export search without those flags
        (`checkpoint_settings`); given `settings` search with them. `chosen`: final/'s
        `chosen_search`, when the caller read it already (the commands, for their flags);
        `settle_search`: in place of `settings`, the search given final/'s `chosen_search` (None on
        another checkpoint), settled from the one read of its metadata (the commands' flags, which
        leave final/ unread until then); `loaded`: the
        (step, metadata, params) `load_checkpoint(workdir, checkpoint)` gave the caller (evaluate, which
        reads them before its data), not read again, and `tokenizers` its metadata's
        `load_tokenizers()`, when the caller loaded them (evaluate, for what is empty to the model).
        Without `loaded`, the checkpoint is read once: the model and the search are checked from its
        metadata before its parameters are read."""
        checkpoint = parse_checkpoint_choice(checkpoint)  # "300" as --checkpoint 300
        check_option_names(kwargs, cls, "Translator.from_workdir", set_by_caller=("target_tokenizer",))
        check_options(kwargs)  # before anything is read
        settled = {}  # the last checkpoint's settled: "latest" is settled again where a damaged newest is skipped

        def settle(metadata: CheckpointMetadata) -> None:  # from the one read of its metadata, before the parameters
            model_config = cls.check_workdir(workdir, checkpoint, metadata)
            source_token_limit(kwargs.get("max_source_tokens"), model_config)
            settled["settings"] = checkpoint_search(
                workdir, checkpoint, metadata, model_config, settings, chosen, settle_search
            )

        if loaded is None:
            loaded = load_checkpoint(workdir, checkpoint, before_params=settle)
        else:
            settle(loaded[1])
        step, metadata, params = loaded
        logger.info("loaded step %d of %s (%s)", step, workdir, checkpoint_name(checkpoint))
        tokenizer, target_tokenizer = metadata.load_tokenizers() if tokenizers is None else tokenizers
        translator = cls(
            metadata.model_config(), params, tokenizer, settled["settings"], target_tokenizer=target_tokenizer, **kwargs
        )
        translator.step = step
        return translator

    @staticmethod
    def check_workdir(
        workdir: str | os.PathLike, checkpoint: str | int = "latest", metadata: CheckpointMetadata | None = None
    ) -> TransformerConfig:
        """The model config of `workdir`'s checkpoint, read from its metadata before any data or
        parameter is (`metadata`: that checkpoint's, when read already); a `ConfigError` naming
        `workdir` when its model is not a translator."""
        return require_architecture(workdir, checkpoint, "encoder_decoder", NEEDS_A_TRANSLATOR, metadata=metadata)

    @classmethod
    def from_export(cls, directory: str | os.PathLike, batch_size: int | None = None, seed: int | None = None):
        """An export's translator (`jaxformer-export`), which decodes with the exported search
        instead of this package's model code: `translate` and `translate_nbest` as here, and
        `translate_ids(source)` on one padded int32 array [B, S] -> (tokens [B, K, L], scores [B, K])
        (`translate_sequences` takes a list of id arrays, as `translate_ids` does here). `seed`: a
        sampling export's, drawn from as here (default: its config.json's). See
        jaxformer/export/standalone.py; `ExportError` names a missing or damaged file."""
        from jaxformer.export.loading import load_export  # lazily: jaxformer.export imports this package

        return load_export(directory, batch_size, seed)

    # -- text --------------------------------------------------------------------------

    def translate(
        self, sentences: Iterable[str], progress: bool = False, *, line_numbers: Sequence[int] | None = None
    ) -> list[str]:
        """One translation per input sentence, in order; `sentences`: any iterable of str (a
        generator, a file's lines), read once before anything is decoded. `line_numbers`: each
        sentence's line in its file, named in the warning about a long one (default: its index + 1)."""
        nbest = self.translate_nbest(sentences, progress, line_numbers=line_numbers)
        return [hypotheses[0][0] for hypotheses in nbest]

    def translate_nbest(
        self, sentences: Iterable[str], progress: bool = False, *, line_numbers: Sequence[int] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Per sentence, the search's hypotheses (beam: beam_size of them) as (text, score), best first."""
        sentences = sentence_batches.sentence_list(sentences)
        pieces, owners = sentence_batches.split_sentences(
            sentences, self.tokenizer, self.max_source_tokens, EOS_ID, line_numbers
        )
        decoded = self.translate_ids(pieces, progress=progress)
        return sentence_batches.join_pieces(owners, decoded, len(sentences), self.target_tokenizer.decode)

    # -- ids ---------------------------------------------------------------------------

    def translate_ids(
        self, sources: Sequence[np.ndarray | Sequence[int]] | np.ndarray, progress: bool = False
    ) -> list[list[tuple[np.ndarray, float]]]:
        """Hypotheses (ids, score) per source id sequence (each ending in EOS, then optionally padding,
        which is dropped: a padded [B, S] array's rows give what they give unpadded), in input order.
        Each sequence is checked first (`checked_id_sequences`): errors name its index in `sources`."""
        if self.params is None:
            raise ValueError("this Translator has no parameters yet: use with_params(params)")
        sources = checked_id_sequences(sources, self.config.encoder_vocab_size, self.config.max_positions)
        results: list[Any] = [None] * len(sources)

        def jobs():  # in order, on this thread: the sampling keys do not depend on thread timing
            for batch_indices, source in sentence_batches.length_sorted_batches(
                sources,
                self.batch_size,
                self.length_bucket,
                PAD_ID,
                EOS_ID,
                compiled_lengths=self._compiled_lengths,
                max_buffer_growth=self.max_buffer_growth,
                extra_length=self.settings.max_extra_length,
            ):
                rng = self._rng
                if self.settings.method == "sample":  # the other searches ignore it: no split to compile
                    self._rng, rng = jax.random.split(self._rng)
                yield batch_indices, source, rng

        def decode(job):
            batch_indices, source, rng = job
            return batch_indices, jax.device_get(self._generate(self.params, source, rng))  # [B, K, L], [B, K]

        with (
            progress_bar(len(sources), "translate", "sent", progress) as bar,
            concurrent.futures.ThreadPoolExecutor(self.parallel_batches) as pool,
        ):
            for batch_indices, (tokens, scores) in pool.map(decode, jobs()):
                for row, index in enumerate(batch_indices):
                    results[index] = [(tokens[row, k], float(scores[row, k])) for k in range(tokens.shape[1])]
                bar.update(len(batch_indices))
        return results


def checked_id_sequences(
    sources: Sequence[Any] | np.ndarray, vocab_size: int, max_positions: int | None = None
) -> list[np.ndarray]:
    """`sources` as int32 arrays, one per sentence, without the padding after its EOS (the rows of
    a padded [B, S] array are sentences too): any integer dtype is cast. One array of ids
    (a sentence, not a list of them), a sequence of another rank, an empty one, a bool, float or
    other dtype, or an id outside [0, vocab_size) is an error in one line naming the sequence's index
    in `sources` (and the id's position): not the row of a length-sorted batch that the search sees.
    An empty sequence, PAD alone, or EOS alone, is no sentence (a sentence's ids end with EOS;
    `translate` gives an empty line no source at all): decoded, it would get an invented output. So is
    one whose last id before its padding is not EOS, or one with EOS before that end (sentences run
    together): the model was trained on single sentences ending in EOS, and would translate either as
    input it never saw. PAD before the end is refused too: the model's mask would drop that token
    without a word, and so is one of more ids than the model's `max_positions`, whose positions it never
    had: exact ids are not split, as translate splits a longer sentence into pieces
    (`sentence_batches.refuse_other_than_one_sentence`)."""
    if isinstance(sources, (np.ndarray, jax.Array)) and np.ndim(sources) == 1:
        raise TypeError(f"sources must be a list of id sequences, not one of shape {np.shape(sources)}: pass [ids]")
    arrays = [np.asarray(source) for source in sources]
    for index, ids in enumerate(arrays):
        sentence_batches.refuse_other_than_one_sentence(ids, EOS_ID, f"source {index}", PAD_ID, max_positions)
    arrays = [sentence_batches.without_trailing_padding(ids, PAD_ID) for ids in arrays]
    for index, ids in enumerate(arrays):  # in the caller's dtype: uint64's 2**63 cast to int64 would be -2**63
        outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        if outside.size:
            raise ValueError(
                f"source {index}: id {ids[outside[0]]} at position {outside[0]} is outside the model's source "
                f"vocabulary [0, {vocab_size})"
            )
    return [ids.astype(np.int32, copy=False) for ids in arrays]


def source_token_limit(max_source_tokens: int | None, config: TransformerConfig) -> int:
    """The most tokens of a source line translated at once, longer lines in pieces: `max_source_tokens`
    (check_options took it), or None: sentence_batches.DEFAULT_MAX_SOURCE_TOKENS, at most the model's positions. A
    ConfigError (a flag's value, which the commands print in one line) where the one given is more
    than the model's positions (model.max_positions, an imported MarianMT model's): checked before
    any parameter is read, as `DecodeSettings.check_fits`."""
    positions = config.max_positions
    if max_source_tokens is None:
        default = sentence_batches.DEFAULT_MAX_SOURCE_TOKENS
        return default if positions is None else min(default, positions)
    if positions is not None and max_source_tokens > positions:
        raise ConfigError(
            f"max_source_tokens={max_source_tokens} is more than the model's {positions} positions "
            f"(model.max_positions): give at most {positions}, or none (longer lines are translated in pieces)"
        )
    return max_source_tokens
