"""Validation BLEU during training, and the best checkpoint by it (workdir/best)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxformer.data.example_words import PAIRS
from jaxformer.data.parallel_text import skipped_pairs_text
from jaxformer.data.pipeline import read_records, record_text
from jaxformer.data.scored_pairs import first_with_pieces
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decoding.generate import SEARCH_FIELDS, DecodeSettings
from jaxformer.decoding.scoring import bleu_tokenizer, corpus_scores
from jaxformer.decoding.translator import Translator
from jaxformer.errors import UserError
from jaxformer.model.config import TransformerConfig
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training.resume_rules import (
    INHERITED_DECODING,
    changed_settings,
    kept_setting_values,
    value_or_before_the_key,
)

logger = logging.getLogger(__name__)

# Every `decoding` key the search reads (beam search's length penalty form too): what a score, or
# the final choice (final_choice.CHOICE_KEYS), depends on of the search.
SEARCH_KEYS = tuple(f"decoding.{key}" for key in SEARCH_FIELDS)

# The config keys a validation BLEU score depends on: which pairs, how many, which search, which
# tokenizer. A score best/ keeps is beaten only by one measured alike (decoding.batch_size moves a
# float or two: no).
BLEU_KEYS = (
    "training.bleu_examples",
    "training.bleu_method",
    "training.bleu_tokenize",
    "data.eval_split",
    *SEARCH_KEYS,
)

# The decoding settings only beam search reads: greedy search's result is the same whatever they are.
# (Renormalising after the bans changes greedy search's scores, not its tokens.)
BEAM_ONLY_KEYS = tuple(
    f"decoding.{key}" for key in ("beam_size", "alpha", "length_penalty", "stop", "renormalize_after_bans")
)


def scored_tokenizer(config: dict[str, Any]) -> str:
    """The sacreBLEU tokenizer of the scores a run with `config` (as a checkpoint saves it) made:
    its training.bleu_tokenize, else sacreBLEU's choice for its target language; 13a where the
    config is older than that key, whatever the language, as scores were made then."""
    training = config.get("training", {})
    if "bleu_tokenize" not in training:
        return "13a"
    return bleu_tokenizer(config["data"]["target_language"], training["bleu_tokenize"])


def decode_settings(config: ml_collections.ConfigDict) -> DecodeSettings:
    """The search the `decoding` section describes; a length_penalty or renormalize_after_bans
    still None (the run's start settles them: run_start.settle_inherited_decoding), or absent in an
    older run's config, is its value before the key existed (INHERITED_DECODING: gnmt, or False)."""
    decoding = config.decoding
    inherited = {key: value_or_before_the_key(key, decoding.get(key)) for key in INHERITED_DECODING}
    return DecodeSettings(
        method=decoding.method,
        beam_size=decoding.beam_size,
        alpha=decoding.alpha,
        stop=decoding.stop,
        max_extra_length=decoding.max_extra_length,
        **inherited,
    )


class ValidationSet:
    """The first `examples` validation pairs with a piece a side (0: all; `scored_pairs`),
    translated with given parameters and scored with sacreBLEU. `tokenizer` encodes the sources;
    `target_tokenizer` (separate vocabularies) decodes the output."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        model_config: TransformerConfig,
        tokenizer: Tokenizer,
        eval_source,
        examples: int,
        target_tokenizer: Tokenizer | None = None,
        settings: DecodeSettings | None = None,
    ):
        """`settings`: the search (default: the config's `decoding` section)."""
        data = config.data
        tokenizers = (tokenizer, target_tokenizer or tokenizer)
        self.sources, self.references = scored_pairs(eval_source, data, examples, tokenizers)
        self.tokenize = bleu_tokenizer(data.target_language, config.training.get("bleu_tokenize"))
        self.translator = Translator(
            model_config,
            None,
            tokenizer,
            decode_settings(config) if settings is None else settings,
            batch_size=config.decoding.batch_size,
            target_tokenizer=target_tokenizer,
        )

    @property
    def settings(self) -> DecodeSettings:
        return self.translator.settings

    def with_settings(self, settings: DecodeSettings) -> ValidationSet:
        """The same sentences searched with other settings (another compiled search)."""
        validation = copy.copy(self)
        validation.translator = self.translator.with_settings(settings)
        return validation

    def score(self, params: Any) -> dict[str, Any]:
        """sacreBLEU's BLEU, chrF, lowercase BLEU and signature of `params`' translations."""
        hypotheses = self.translator.with_params(params).translate(self.sources)
        return corpus_scores(hypotheses, self.references, self.tokenize)


def scored_pairs(
    eval_source, data: ml_collections.ConfigDict, examples: int, tokenizers: tuple[Tokenizer, Tokenizer]
) -> tuple[list[str], list[str]]:
    """(sources, references) of the first `examples` validation pairs (0: all) whose sides both
    encode to a piece and show something, counted as evaluate's --max_examples counts them: one of
    zero-width spaces, joiners or control characters alone is empty, as evaluate reads it (translate
    gives such a source an empty output, which a score would count); those left out before the last
    scored are said in one warning, in the training pipeline's words."""
    records = read_records(eval_source)  # read only as far as the pairs scored need
    pairs = (
        (index, record_text(record, data.source_language), record_text(record, data.target_language))
        for index, record in enumerate(records)
    )
    scored, no_piece = first_with_pieces(pairs, examples or None, tokenizers)
    scored = scored[:examples] if examples else scored
    read = scored[-1][0] + 1 if examples and len(scored) == examples else len(eval_source)
    left_out = [index for index in no_piece if index < read]
    if left_out:
        where = f"the first {read:,} validation pairs scored for BLEU"
        first_place = f"pair {min(left_out) + 1:,}; {PAIRS.first_no_piece}"
        logger.warning("%s", skipped_pairs_text(len(left_out), where, first_place))
    return [pair[1] for pair in scored], [pair[2] for pair in scored]


class BleuValidator:
    """Scores the current parameters on the first `training.bleu_examples` validation pairs
    (ValidationSet) with the search `training.bleu_method` names (None: `decoding`'s), and saves
    them to workdir/best when BLEU improves."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        model_config: TransformerConfig,
        tokenizer: Tokenizer,
        eval_source,
        workdir: str | os.PathLike,
        target_tokenizer: Tokenizer | None = None,
    ):
        settings = decode_settings(config)
        if config.training.get("bleu_method") is not None:  # cheaper than the final search, e.g. greedy
            settings = dataclasses.replace(settings, method=config.training.bleu_method)
        self.validation = ValidationSet(
            config, model_config, tokenizer, eval_source, config.training.bleu_examples, target_tokenizer, settings
        )
        self.best = Checkpointer(RunDirectory(workdir).best, keep=1)
        best = self.best.latest_metadata()
        self.best_bleu = best.bleu if best is not None and best.bleu is not None else -math.inf

    def __call__(self, step: int, params: Any, metadata: CheckpointMetadata) -> dict[str, float]:
        """Scores `params`; when BLEU improves, saves them to workdir/best with `metadata`
        (its step and BLEU set to this step's)."""
        scores = self.validation.score(params)
        logger.info(
            "step %d: validation BLEU %.2f on %d sentences (%s)",
            step,
            scores["bleu"],
            len(self.validation.sources),
            scores["bleu_signature"],
        )
        if scores["bleu"] > self.best_bleu:
            self.best_bleu = scores["bleu"]
            self.best.save_params(step, params, metadata.replace(step=step, bleu=scores["bleu"]))
            logger.info("step %d: best validation BLEU so far; parameters saved to %s", step, self.best.directory)
        return {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "lowercase_bleu": scores["lowercase_bleu"],
            "best_bleu": self.best_bleu,
        }

    def close(self) -> None:
        self.best.close()


def bleu_settings(config: dict[str, Any], keys: Sequence[str] = BLEU_KEYS) -> dict[str, Any]:
    """The `keys` values of a config as a checkpoint saves it or as a run has it now
    (`kept_setting_values`), as its scores were made: training.bleu_tokenize the tokenizer it
    scored with (scored_tokenizer), an INHERITED_DECODING key left None its value before the key
    existed (a length penalty gnmt, renormalize_after_bans off)."""
    values = kept_setting_values(config, keys)
    values["training.bleu_tokenize"] = scored_tokenizer(config)
    for key in INHERITED_DECODING:  # None: the run's start did not settle it
        if f"decoding.{key}" in values:
            values[f"decoding.{key}"] = value_or_before_the_key(key, values[f"decoding.{key}"])
    return values


def bleu_measure(values: dict[str, Any]) -> dict[str, Any]:
    """`bleu_settings`' `values` as far as they change the score: the search training.bleu_method
    names (None: decoding.method's), its beam size, alpha, length penalty and stop rule only for
    beam search (greedy search reads none of them)."""
    measure = dict(values)
    method = measure["training.bleu_method"] or measure["decoding.method"]
    measure["training.bleu_method"] = measure["decoding.method"] = method
    if method != "beam":
        for key in BEAM_ONLY_KEYS:
            if key in measure:
                measure[key] = None
    return measure


def bleu_measured_alike(made_with: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether validation BLEU scores with the config `now` as with `made_with` (configs as a
    checkpoint saves them), as far as their BLEU_KEYS tell: the one rule of best/'s score and of a
    record a shortened run reuses (shortened_end.py)."""
    return bleu_measure(bleu_settings(made_with)) == bleu_measure(bleu_settings(now))


def check_best_measured_alike(config: ml_collections.ConfigDict, run: RunDirectory, resume_step: int) -> None:
    """Before anything is prepared, for a run resuming from checkpoint `resume_step` that validates
    again: a UserError naming the BLEU_KEYS values that differ from those best/'s score was measured
    with. BleuValidator compares each new score with that one, and two measures would decide which
    parameters best/ (then the final choice) keeps. best/'s steps after `resume_step` are not
    compared: the run sets them aside before it validates (run/rolled_back.py)."""
    if not config.training.bleu_every_steps or not run.best.is_dir():
        return
    reader = Checkpointer(run.best, keep=None, read_only=True)
    try:
        latest = reader.latest_step_metadata(last_step=resume_step)
    finally:
        reader.close()
    if latest is None or latest[1].bleu is None:  # nothing BleuValidator compares with
        return
    step, best = latest
    if not bleu_measured_alike(best.config, config.to_dict()):
        was, now = bleu_settings(best.config), bleu_settings(config.to_dict())
        named = changed_settings(BLEU_KEYS, was, now, bleu_measure(was), bleu_measure(now))
        raise UserError(
            f"the validation BLEU {best.bleu:.2f} of {run.best / str(step)}, which new scores are compared with, "
            f"was measured with {named}: restore the setting it was measured with, or move {run.best} aside "
            f"(e.g. to {run.best}.before) to keep the best by the new measure"
        )
