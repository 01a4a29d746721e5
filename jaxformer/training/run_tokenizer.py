"""The run's tokenizer: trained once per workdir on the training split, then reused; on resume
it must be the one stored in the checkpoint (restored from there when the file is gone)."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterator, Sequence

import jax
import ml_collections

from jaxformer.data.pipeline import record_text
from jaxformer.data.tokenizer import Tokenizer, TokenizerError, train_tokenizer
from jaxformer.errors import CheckpointError


def _checked_against_checkpoint(path: pathlib.Path, saved_proto: bytes, where: str) -> Tokenizer:
    """The checkpoint's tokenizer, restored to `path`, or checked to be the one at `path`."""
    try:
        saved = Tokenizer(saved_proto)
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"the tokenizer stored in {where} is unusable ({type(error).__name__}: {error})"
        ) from error
    if not path.exists():
        saved.save(path)
        logging.info("restored %s from %s", path, where)
        return saved
    try:
        tokenizer = Tokenizer.load(path)
    except TokenizerError as error:
        raise CheckpointError(f"{error}; delete it to restore it from {where}") from error
    if tokenizer.model_proto != saved.model_proto:
        raise CheckpointError(
            f"{path} is not the tokenizer stored in {where}, which the model was trained with; "
            f"delete {path} to restore it from the checkpoint, or train in a new workdir"
        )
    return saved


def _sentences(train_source: Sequence, languages: Sequence[str]) -> Iterator[str]:
    chunk = 4096  # batched reads: one random access per record is several times slower
    for start in range(0, len(train_source), chunk):
        indices = list(range(start, min(start + chunk, len(train_source))))
        if hasattr(train_source, "__getitems__"):
            records = train_source.__getitems__(indices)
        else:
            records = [train_source[i] for i in indices]
        for record in records:
            for language in languages:
                yield record_text(record, language)


def tokenizer_for_run(
    config: ml_collections.ConfigDict,
    path: pathlib.Path,
    train_source: Sequence,
    saved: tuple[bytes, str] | None,
) -> Tokenizer:
    """The tokenizer at `path`, trained there first if missing. `saved` is (the sentencepiece
    model stored in the newest checkpoint, a description of that checkpoint) when resuming.
    `config` is the experiment config (its tokenizer and data sections)."""
    if saved is not None:
        tokenizer = _checked_against_checkpoint(path, *saved)
    elif path.exists():
        tokenizer = Tokenizer.load(path)
    else:
        tokenizer = None
    if tokenizer is not None:
        if tokenizer.vocab_size != config.tokenizer.vocab_size:
            raise CheckpointError(
                f"{path} has {tokenizer.vocab_size} pieces but tokenizer.vocab_size={config.tokenizer.vocab_size}; "
                "use a new workdir to train a new tokenizer"
            )
        return tokenizer
    section = config.tokenizer
    tokenizer = train_tokenizer(
        _sentences(train_source, (config.data.source_language, config.data.target_language)),
        section.vocab_size,
        section.model_type,
        section.character_coverage,
        section.max_sentences,
    )
    if jax.process_index() == 0:  # training is deterministic: every process holds the same model
        tokenizer.save(path)
        logging.info("trained a %d-piece tokenizer, saved to %s", tokenizer.vocab_size, path)
    return tokenizer
