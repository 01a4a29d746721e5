"""The run's tokenizers: one shared vocabulary (the default) or a source and a target one
(tokenizer.separate_vocabularies). Each is trained once per workdir on the training split (the
shared one on both sides' text, a separate one on its own side's), or converted from a given
sentencepiece model (tokenizer.model_path / target_model_path), then reused; on resume each
must be the one stored in the checkpoint (restored from there when the file is gone)."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Iterator, Sequence

import jax
import ml_collections
import numpy as np

from jaxformer.data.pipeline import read_records, record_text
from jaxformer.data.subword_sampling import SubwordSampling
from jaxformer.data.tokenizer import Tokenizer, TokenizerError, pieces_text, train_tokenizer
from jaxformer.errors import CheckpointError
from jaxformer.run.directory import RunDirectory
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.tokens import UNK_ID
from jaxformer.training import text_sides

logger = logging.getLogger(__name__)

SavedTokenizer = tuple[bytes, str]  # a sentencepiece model, and where it comes from (for messages)


@dataclasses.dataclass(frozen=True)
class RunTokenizers:
    """The source and target tokenizers of a run: the same object for a shared vocabulary."""

    source: Tokenizer
    target: Tokenizer

    @property
    def shared(self) -> bool:
        return self.target is self.source


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
        logger.info("restored %s from %s", path, where)
        return saved
    _check_workdir_copy(path, saved, where)
    return saved


def _check_workdir_copy(path: pathlib.Path, saved: Tokenizer, where: str) -> None:
    """A CheckpointError when the workdir's tokenizer file `path` is unreadable or is not `saved`,
    the tokenizer stored in `where` that the model was trained with."""
    try:
        tokenizer = Tokenizer.load(path)
    except TokenizerError as error:
        raise CheckpointError(f"{error}; delete it to restore it from {where}") from error
    if tokenizer.model_proto != saved.model_proto:
        raise CheckpointError(
            f"{path} is not the tokenizer stored in {where}, which the model was trained with; "
            f"delete {path} to restore it from the checkpoint, or train in a new workdir"
        )


def _given_model_differs(
    model_key: str,
    model_path: str,
    path: pathlib.Path,
    saved: SavedTokenizer | None,
    resuming: bool,
    run_saved: tuple[CheckpointMetadata, str] | None = None,
) -> CheckpointError:
    """The error for a given tokenizer.`model_key` that does not convert to the run's tokenizer
    (the workdir's file `path`, or `saved`'s: the checkpoint's the parameters come from).
    `run_saved`: that checkpoint's (metadata, description) where it is a run's, the workdir's own
    when `resuming` or a fine-tuning start's, whose config says what it was trained with; None
    for a side of a composed translator (only its tokenizer is known)."""
    if saved is None:  # no checkpoint: nothing says what the workdir's file is, only how it came there
        advice = (
            f"does not convert to {path}, a tokenizer no checkpoint of the workdir was made with (left by an earlier "
            "start that saved none, which trained its own tokenizer or converted another model, or this one before "
            f"it changed); delete it to convert tokenizer.{model_key} there, or use a new workdir"
        )
    elif run_saved is not None:
        # The config of the checkpoint's run says what it was trained with: "restore it" only where that is this file.
        trained_with, run = _trained_with(run_saved, model_key), "the run" if resuming else "the start"
        copy = f"{path}, the checkpoint's conversion of it, converts to the same tokenizer if copied to {model_path}"
        if trained_with is None:
            why = f"{run} trained its own tokenizer (tokenizer.{model_key} was unset)"
        elif pathlib.Path(trained_with).expanduser().resolve() == pathlib.Path(model_path).expanduser().resolve():
            why = f"the file changed after {run} trained with it (restore it{f': {copy}' if resuming else ''})"
        else:
            why = f"{run} was trained with tokenizer.{model_key}={trained_with}"
        keep, other = (f"resume with the run's own copy ({path})", "train in a new workdir")
        if not resuming:
            keep, other = "fine-tune with the start's tokenizer", "start from another run"
        advice = (
            f"does not convert to the tokenizer of {saved[1]}, which the model was trained with: {why}; leave "
            f"tokenizer.{model_key} unset to {keep}, or {other}"
        )
    else:
        advice = (
            f"does not convert to the tokenizer of {saved[1]}, which the model was trained with (the file "
            f"changed since, or it is another model); restore that file, or leave tokenizer.{model_key} "
            "unset to use the model's"
        )
    return CheckpointError(f"tokenizer.{model_key} {model_path} {advice}")


def _trained_with(saved: tuple[CheckpointMetadata, str], model_key: str) -> str | None:
    """The tokenizer.`model_key` of the checkpoint `saved`'s run (None when it trained its own)."""
    return (saved[0].config or {}).get("tokenizer", {}).get(model_key)


def _given_model(config: ml_collections.ConfigDict, model_key: str, path: pathlib.Path, resuming: bool) -> Tokenizer:
    """tokenizer.`model_key`, converted; on resume, a file that cannot be read says that the run
    has its own copy of the tokenizer it trained with."""
    try:
        return Tokenizer.from_sentencepiece_file(config.tokenizer[model_key], text_sides.control_symbols(config))
    except TokenizerError as error:
        if not resuming:
            raise
        raise TokenizerError(
            f"{error}; the run keeps its own copy of the tokenizer it trained with ({path}): leave "
            f"tokenizer.{model_key} unset to resume with it"
        ) from error


def _sentences(train_source: Sequence, languages: Sequence[str], max_sentences: int, seed: int = 0) -> Iterator[str]:
    """The `languages` sides of the training records; beyond `max_sentences` sentences, those of
    a seeded sample of records, drawn before reading (decoding every record of a large corpus
    costs more than training the tokenizer on the sample)."""
    indices = np.arange(len(train_source))
    if len(indices) * len(languages) > max_sentences:
        sample_size = max(1, max_sentences // len(languages))
        indices = np.sort(np.random.default_rng(seed).choice(len(indices), sample_size, replace=False))
    for record in read_records(train_source, indices):
        for language in languages:
            yield record_text(record, language)


def _one_tokenizer(
    config: ml_collections.ConfigDict,
    path: pathlib.Path,
    languages: Sequence[str],
    model_key: str,
    train_source: Sequence,
    saved: tuple[bytes, str] | None,
    resuming: bool = False,
    run_saved: tuple[CheckpointMetadata, str] | None = None,
) -> Tokenizer:
    """The tokenizer at `path`: checked against the checkpoint's (`saved`: its model, where; one of
    the workdir's own checkpoints when `resuming`, else a start's), loaded, or made there first:
    converted from tokenizer.`model_key` when that is set, else trained on the `languages` sides
    of the training split. `run_saved`: the run's checkpoint `saved` comes from, (metadata, where),
    whose config the error for a given model that is not its tokenizer reads."""
    section = config.tokenizer
    model_path, control = section[model_key], text_sides.control_symbols(config)
    if saved is not None:
        tokenizer = _checked_against_checkpoint(path, *saved)
    elif path.exists():
        tokenizer = Tokenizer.load(path)
    else:
        tokenizer = None
    if model_path is not None:
        given = _given_model(config, model_key, path, resuming and saved is not None)
        if tokenizer is None:
            if section.vocab_size != given.vocab_size:
                logger.info(
                    "tokenizer.%s %s; it replaces tokenizer.vocab_size=%d for this vocabulary",
                    model_key,
                    pieces_text(model_path, given),
                    section.vocab_size,
                )
            if jax.process_index() == 0:
                given.save(path)
                logger.info("converted %s to jaxformer's special ids, saved to %s", model_path, path)
            return given
        if given.model_proto != tokenizer.model_proto:
            raise _given_model_differs(model_key, model_path, path, saved, resuming, run_saved)
        return tokenizer
    if tokenizer is not None:
        if tokenizer.vocab_size != section.vocab_size and saved is not None:
            # A start's tokenizer comes with its embeddings; nothing is trained here. (A resumed run
            # whose tokenizer.vocab_size changed was refused before: run_start.check_same_run.)
            logger.info(
                "the tokenizer of %s has %d pieces: it replaces tokenizer.vocab_size=%d for this vocabulary",
                saved[1],
                tokenizer.vocab_size,
                section.vocab_size,
            )
        elif tokenizer.vocab_size != section.vocab_size:
            raise CheckpointError(
                f"{path} has {tokenizer.vocab_size} pieces but tokenizer.vocab_size={section.vocab_size}; "
                "use a new workdir to train a new tokenizer"
            )
        if saved is not None:
            return tokenizer
    # Training is deterministic: a file that no checkpoint vouches for (left by an earlier start in
    # this workdir that wrote no checkpoint, or by a failed fine-tuning) is used only if it is the
    # one this config trains on this data.
    try:
        trained = train_tokenizer(
            _sentences(train_source, languages, section.max_sentences),
            section.vocab_size,
            section.model_type,
            section.character_coverage,
            section.max_sentences,
            control_symbols=control,
        )
    except TokenizerError as error:
        if not section.separate_vocabularies:
            raise
        raise TokenizerError(f"the {'+'.join(languages)!r} tokenizer (separate vocabularies): {error}") from None
    if tokenizer is not None:
        if trained.model_proto != tokenizer.model_proto:
            raise CheckpointError(
                f"{path} is not the tokenizer this config trains on the {'+'.join(languages)} text of this data, and "
                "no checkpoint of the workdir was made with it (an earlier start left it?); delete it to train "
                "a new one, or use a new workdir"
            )
        logger.info("%s is the tokenizer this config trains on this data: reused", path)
        return tokenizer
    tokenizer = trained
    if jax.process_index() == 0:  # training is deterministic: every process holds the same model
        tokenizer.save(path)
        logger.info(
            "trained a %d-piece tokenizer on the %s text, saved to %s", tokenizer.vocab_size, "+".join(languages), path
        )
    return tokenizer


def tokenizer_for_run(
    config: ml_collections.ConfigDict,
    run: RunDirectory,
    train_source: Sequence,
    saved: tuple[CheckpointMetadata, str] | None,
    sides: tuple[SavedTokenizer | None, SavedTokenizer | None] = (None, None),
    resuming: bool = False,
) -> RunTokenizers:
    """The run's tokenizers, in `run.tokenizer_file` (shared or source) and, with separate
    vocabularies, `run.target_tokenizer_file`. `saved` is (a checkpoint's metadata, a description
    of that checkpoint) when the parameters come from one: the newest on resume, the fine-tuning
    start's otherwise. `sides` are the (source, target) tokenizers of a translator composed from
    an encoder's and a decoder's runs, (model, where) each, or None for a side trained here.
    `resuming`: `saved` is the workdir's own checkpoint. `config` is the experiment config (its
    tokenizer and data sections)."""
    run = RunDirectory(run)
    data = config.data
    source_saved, target_saved = _saved_sides(config, saved, sides)
    if not config.tokenizer.separate_vocabularies:
        languages = text_sides.text_languages(config)
        shared = _one_tokenizer(
            config,
            run.tokenizer_file,
            languages,
            "model_path",
            train_source,
            source_saved,
            resuming,
            saved,
        )
        return RunTokenizers(shared, shared)
    source = _one_tokenizer(
        config,
        run.tokenizer_file,
        (data.source_language,),
        "model_path",
        train_source,
        source_saved,
        resuming,
        saved,
    )
    target = _one_tokenizer(
        config,
        run.target_tokenizer_file,
        (data.target_language,),
        "target_model_path",
        train_source,
        target_saved,
        resuming,
        saved,
    )
    return RunTokenizers(source, target)


def _saved_sides(
    config: ml_collections.ConfigDict,
    saved: tuple[CheckpointMetadata, str] | None,
    sides: tuple[SavedTokenizer | None, SavedTokenizer | None],
) -> tuple[SavedTokenizer | None, SavedTokenizer | None]:
    """(source, target) tokenizers that come from checkpoints (tokenizer_for_run's `saved` and
    `sides`), None for a side made here; the shared one twice over for one shared vocabulary."""
    source_saved, target_saved = sides
    if not config.tokenizer.separate_vocabularies and None not in sides and sides[0][0] != sides[1][0]:
        raise CheckpointError(
            f"{sides[0][1]} and {sides[1][1]} have different tokenizers, so they cannot share one vocabulary: "
            "set tokenizer.separate_vocabularies=True and model.share_embeddings=False"
        )
    if not config.tokenizer.separate_vocabularies:
        source_saved = source_saved or target_saved
    if saved is not None:
        metadata, where = saved
        separate = metadata.target_tokenizer is not None
        if separate != bool(config.tokenizer.separate_vocabularies):
            raise CheckpointError(
                f"{where} has {'separate source and target vocabularies' if separate else 'one shared vocabulary'}, "
                f"but tokenizer.separate_vocabularies={config.tokenizer.separate_vocabularies}"
            )
        source_saved = (metadata.tokenizer, where)
        target_saved = None if metadata.target_tokenizer is None else (metadata.target_tokenizer, where)
    return source_saved, target_saved


def check_given_models(
    config: ml_collections.ConfigDict,
    run: RunDirectory,
    saved: tuple[CheckpointMetadata, str] | None,
    sides: tuple[SavedTokenizer | None, SavedTokenizer | None] = (None, None),
    resuming: bool = False,
) -> None:
    """tokenizer_for_run's refusals that need no data, before any is prepared: checkpoints whose
    vocabularies cannot be the config's, a workdir's tokenizer file that is not the one stored in
    that checkpoint (swapped or edited), a given model that does not convert to the tokenizer of
    the checkpoint its side's embeddings come from, and subword sampling (tokenizer.sampling_nbest)
    with a tokenizer, given or a checkpoint's, that is not a unigram model; and a given model that
    does not convert to the workdir's file where no checkpoint vouches for that (an earlier start's).
    Reads the given models and the workdir's; writes nothing."""
    run = RunDirectory(run)
    source_saved, target_saved = _saved_sides(config, saved, sides)
    sampling = SubwordSampling.from_config(config.tokenizer)
    keyed = [("model_path", source_saved, run.tokenizer_file)]
    if config.tokenizer.separate_vocabularies:
        keyed.append(("target_model_path", target_saved, run.target_tokenizer_file))
    for model_key, side_saved, path in keyed:
        model_path = config.tokenizer[model_key]
        stored = None
        if side_saved is not None:
            try:
                stored = Tokenizer(side_saved[0])  # as _one_tokenizer reads it
            except (TypeError, ValueError):
                continue  # unusable: _checked_against_checkpoint names it
            if path.exists():
                _check_workdir_copy(path, stored, side_saved[1])
        if model_path is None and (stored is None or sampling is None):
            continue
        given = None if model_path is None else _given_model(config, model_key, path, resuming)
        if given is not None and stored is not None and given.model_proto != stored.model_proto:
            raise _given_model_differs(model_key, model_path, path, side_saved, resuming, saved)
        if given is not None and stored is None and path.exists():  # an earlier start's, as _one_tokenizer reads it
            if Tokenizer.load(path).model_proto != given.model_proto:
                raise _given_model_differs(model_key, model_path, path, None, resuming)
        if sampling is not None:  # the data is prepared before the pipeline would say so
            where = f"tokenizer.{model_key} {model_path}" if given else f"the tokenizer of {side_saved[1]}"
            sampling.check(given or stored, where)


UNKNOWN_WARNING = 0.005  # a share of <unk> pieces above this on the training text is warned about
UNKNOWN_SAMPLE = 2000  # training examples (pairs, or a language model's texts) encoded to measure it


def log_unknown_rate(config: ml_collections.ConfigDict, tokenizers: RunTokenizers, train_source: Sequence) -> None:
    """Logs the share of <unk> pieces each side's tokenizer gives on a seeded sample of the
    training split, with a warning above UNKNOWN_WARNING: a given model for another language or
    script spells part of the text as <unk>, which the model can then never write."""
    data = config.data
    by_language = {data.source_language: tokenizers.source, data.target_language: tokenizers.target}
    languages = text_sides.text_languages(config)
    count = min(len(train_source), UNKNOWN_SAMPLE)
    indices = np.sort(np.random.default_rng(0).choice(len(train_source), count, replace=False))
    texts = {language: [] for language in languages}
    for record in read_records(train_source, indices):
        for language in languages:
            texts[language].append(record_text(record, language))
    shares = {}
    for language in languages:
        ids = np.concatenate(by_language[language].encode(texts[language], add_eos=False) or [np.zeros(0, np.int32)])
        shares[language] = float(np.mean(ids == UNK_ID)) if ids.size else 0.0
    summary = ", ".join(f"{language} {100 * share:.2f}%" for language, share in shares.items())
    examples = text_sides.example_noun(config)
    logger.info("<unk> pieces on %d training %s: %s", count, examples, summary)
    for language, share in shares.items():
        if share > UNKNOWN_WARNING:
            logger.warning(
                "%.1f%% of the %s side's pieces are <unk> on %d training %s: its tokenizer cannot spell part "
                "of this text (a model for another language or script?), and the model can never write it",
                100 * share,
                language,
                count,
                examples,
            )
