"""An export's translator: sentences, or their ids, through the export's program on this
machine, tokenized, batched and joined as `jaxformer.decoding.translator.Translator` does, so the
results are the same. `load` in serve.py (jaxformer/export/standalone.py) reads an export's files
and makes one.

serve.py imports this module; `jaxformer-export` copies it beside serve.py, so it imports no
jaxformer module in an export: there serve.py gives it the names below that it takes from its
other helpers and itself before running it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np

if __package__:  # jaxformer.export.exported_translator; an export's copy is given these by serve.py (`_import_beside`)
    from jaxformer.decoding import sentence_batches
    from jaxformer.export import export_files, export_program
    from jaxformer.export.standalone import CONFIG_FILE


class ExportedTranslator:
    """Translates with an export's program. Sentences are tokenized, sorted by length and decoded
    in batches of `batch_size` rows whose length is rounded up to a multiple of the export's
    length bucket; sentences longer than its max_source_tokens are translated in pieces. This
    is what `jaxformer.decoding.translator.Translator` does, so the results are the same."""

    def __init__(
        self,
        config: dict[str, Any],
        params: Any,
        tokenizer: export_files.Tokenizer,
        program: jax.export.Exported,
        batch_size: int | None = None,
        target_tokenizer: export_files.Tokenizer | None = None,  # separate vocabularies: decodes the output
        seed: int | None = None,  # sampling's; None: config.json's decoding.seed
    ):
        serving = config["serving"]
        self.config, self.tokenizer, self.program = config, tokenizer, program
        self.target_tokenizer = target_tokenizer or tokenizer
        self.params = jax.device_put(params)
        self.batch_size = export_program.checked_batch_size(serving["batch_size"] if batch_size is None else batch_size)
        self.length_bucket = int(serving["length_bucket"])
        self.max_source_tokens = int(serving["max_source_tokens"])
        self.max_source_length = int(serving["max_source_length"])
        self.vocab_size = int(config["model"].get("source_vocab_size") or config["model"]["vocab_size"])  # source's
        self.max_positions = config["model"].get("max_positions")  # an imported model's; None: no last position
        self._run = jax.jit(program.call)  # one compilation per (batch, length) shape
        self.method = config["decoding"]["method"]
        self._rng = export_program.first_key(config, seed, CONFIG_FILE)  # sampling's, split once per batch

    # -- text -------------------------------------------------------------------------------

    def translate(self, sentences: Iterable[str], progress: bool = False) -> list[str]:
        """One translation per input sentence, in order; an empty sentence gives "". `sentences`:
        any iterable of str (a generator, a file's lines), read once before anything is decoded."""
        return [hypotheses[0][0] for hypotheses in self.translate_nbest(sentences, progress)]

    def translate_nbest(self, sentences: Iterable[str], progress: bool = False) -> list[list[tuple[str, float]]]:
        """Per sentence, the search's hypotheses as (text, score), best first (beam search's
        beam_size, one for greedy search and sampling); `progress` counts the decoded pieces on stderr."""
        sentences = sentence_batches.sentence_list(sentences)
        pieces, owners = sentence_batches.split_sentences(
            sentences, self.tokenizer, self.max_source_tokens, self.tokenizer.eos_id
        )
        decoded = self.translate_sequences(pieces, progress)
        return sentence_batches.join_pieces(owners, decoded, len(sentences), self.target_tokenizer.decode)

    # -- ids --------------------------------------------------------------------------------

    def translate_sequences(
        self, sources: Sequence[np.ndarray], progress: bool = False
    ) -> list[list[tuple[np.ndarray, float]]]:
        """Hypotheses (ids, score) per source id sequence (each ending in EOS, then optionally padding,
        which is dropped), in input order. Each is checked before any batch runs (`_refuse_bad_ids`),
        errors naming its index in `sources`."""
        if isinstance(sources, (np.ndarray, jax.Array)) and np.ndim(sources) == 1:
            raise TypeError(f"sources must be a list of id sequences, not one of shape {np.shape(sources)}: pass [ids]")
        sources = [np.asarray(ids) for ids in sources]
        for index, ids in enumerate(sources):
            _refuse_bad_ids(ids, self.tokenizer, f"source {index}", self.vocab_size, self.max_positions)
        sources = [sentence_batches.without_trailing_padding(ids, self.tokenizer.pad_id) for ids in sources]
        for index, ids in enumerate(sources):  # the program's bound on S, before any batch runs
            if (padded := sentence_batches.padded_length(len(ids), self.length_bucket)) > self.max_source_length:
                raise ValueError(
                    f"source {index} has {len(ids)} ids (EOS included), padded to {padded} (serving.length_bucket "
                    f"{self.length_bucket}): more than the {self.max_source_length} this export's program takes "
                    "(serving.max_source_length, jaxformer-export --max_source_tokens); translate() splits a "
                    "longer sentence into pieces"
                )
        results: list[Any] = [None] * len(sources)
        batches = sentence_batches.length_sorted_batches(
            sources, self.batch_size, self.length_bucket, self.tokenizer.pad_id, self.tokenizer.eos_id
        )
        translated = 0
        for indices, batch in batches:
            tokens, scores = self._decode_batch(batch)  # its filler rows are EOS alone
            for row, index in enumerate(indices):
                results[index] = [(tokens[row, k], float(scores[row, k])) for k in range(tokens.shape[1])]
            translated += len(indices)
            if progress:
                sys.stderr.write(f"\rtranslate: {translated}/{len(sources)}")
        if progress and sources:
            sys.stderr.write("\n")
        return results

    def translate_ids(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The program on padded source rows int32 [B, S] (pad 0, each row ending in EOS):
        (tokens int32 [B, K, S + max_extra_length] best first, ending in EOS then padding,
        scores float32 [B, K], log p / length penalty; K = 1 and log p but for beam search; sampling
        draws with the next key). A row of no ids (`[[]]`), of padding alone, EOS
        alone, a row whose last id before the padding is not EOS, or one with EOS or PAD before that, is
        refused, as `translate_sequences` refuses such a source: only the padding after a row's EOS is
        no part of its sentence. So is a row of more ids than the model's max_positions (its padding not
        counted): the program would compute positions the model never had."""
        source = sentence_batches.padded_rows(source, self.tokenizer.pad_id)
        if source.ndim != 2 or not len(source):  # then each row's check names its fault ([[]]: empty, not float64)
            raise ValueError(f"source must be padded rows of ids [B, S], at least one; got shape {source.shape}")
        for row, ids in enumerate(source):
            _refuse_bad_ids(ids, self.tokenizer, f"source row {row}", self.vocab_size, self.max_positions)
        return self._decode_batch(source)

    def _decode_batch(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if source.shape[1] > self.max_source_length:
            raise ValueError(
                f"source length {source.shape[1]} exceeds the {self.max_source_length} tokens this export "
                "was made for (jaxformer-export --max_source_tokens)"
            )
        key = ()
        if self._rng is not None:  # sampling: this batch's key, split off as Translator splits it
            self._rng, rng = jax.random.split(self._rng)
            key = (jax.random.key_data(rng),)
        tokens, scores = self._run(self.params, source.astype(np.int32), *key)
        return np.asarray(tokens), np.asarray(scores)


def _refuse_bad_ids(
    ids: np.ndarray,
    tokenizer: export_files.Tokenizer,
    name: str,
    vocab_size: int | None = None,
    max_positions: int | None = None,
) -> None:
    """A one-line error naming `name` for ids that are no one sentence's or more than the model's
    `max_positions` (sentence_batches.py's check, which Translator.translate_ids shares and every
    export carries), or with `vocab_size` for an id outside [0, vocab_size), naming its position."""
    sentence_batches.refuse_other_than_one_sentence(ids, tokenizer.eos_id, name, tokenizer.pad_id, max_positions)
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size)) if vocab_size is not None else []
    if len(outside):
        raise ValueError(
            f"{name}: id {ids[outside[0]]} at position {outside[0]} is outside the model's source "
            f"vocabulary [0, {vocab_size})"
        )
