"""What every non-model key of an experiment config allows: one (check, description) rule per key,
read by `experiment.validate` before anything is prepared, compiled or written (the model section
is checked by TransformerConfig)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxformer.decoding.search import BEAM_STOPS
from jaxformer.run.directory import CHECKPOINT_KINDS
from jaxformer.tokens import NUM_SPECIAL_TOKENS


def _integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: _integer(value) and value >= low), f"an integer >= {low}"


def _one_of(*choices: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: value in choices), "one of " + ", ".join(map(repr, choices))


def _within(low: float, high: float, closed_high: bool = False) -> tuple[Callable[[Any], bool], str]:
    if closed_high:
        return (lambda value: _number(value) and low <= value <= high), f"a number in [{low}, {high}]"
    return (lambda value: _number(value) and low <= value < high), f"a number in [{low}, {high})"


_POSITIVE_NUMBER = (lambda value: _number(value) and value > 0 and math.isfinite(value)), "a finite number > 0"
_NON_EMPTY_TEXT = (lambda value: isinstance(value, str) and value.strip() != ""), "a non-empty string"
_OPTIONAL_TEXT = (
    (lambda value: value is None or (isinstance(value, str) and value.strip() != "")),
    "None or a non-empty path",
)
_MESH_SHAPE = (
    lambda value: (
        isinstance(value, (tuple, list))
        and len(value) == 3
        and all(_integer(size) and (size >= 1 or size == -1) for size in value)
        and list(value).count(-1) <= 1
    ),
    "three integers (data, fsdp, tensor), each >= 1 or one of them -1",
)

VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "data.name": _NON_EMPTY_TEXT,
    "data.source_language": _NON_EMPTY_TEXT,
    "data.target_language": _NON_EMPTY_TEXT,
    "data.data_dir": _OPTIONAL_TEXT,
    "data.raw_dir": _OPTIONAL_TEXT,
    "data.download": ((lambda value: isinstance(value, bool)), "True or False"),
    "data.files.train": _OPTIONAL_TEXT,
    "data.files.validation": _OPTIONAL_TEXT,
    "data.files.test": _OPTIONAL_TEXT,
    "data.validation_holdout": _at_least(1),
    "data.train_split": _NON_EMPTY_TEXT,
    "data.eval_split": _NON_EMPTY_TEXT,
    "data.max_length": _at_least(2),
    "data.batch_size": _at_least(1),
    "data.eval_batch_size": _at_least(1),
    "data.max_eval_examples": (
        (lambda value: value is None or (_integer(value) and value >= 1)),
        "None or an integer >= 1",
    ),
    "data.shuffle_seed": _at_least(0),
    "data.num_threads": _at_least(0),
    "data.encode_once_max_examples": _at_least(0),
    "data.input_shards": _at_least(0),
    "tokenizer.vocab_size": _at_least(NUM_SPECIAL_TOKENS + 1),
    "tokenizer.model_type": _one_of("unigram", "bpe"),
    "tokenizer.character_coverage": ((lambda value: _number(value) and 0 < value <= 1), "a number in (0, 1]"),
    "tokenizer.max_sentences": _at_least(1),
    "tokenizer.model_path": _OPTIONAL_TEXT,
    "tokenizer.separate_vocabularies": ((lambda value: isinstance(value, bool)), "True or False"),
    "tokenizer.target_model_path": _OPTIONAL_TEXT,
    "tokenizer.sampling_nbest": _at_least(0),
    "tokenizer.sampling_alpha": (
        (lambda value: _number(value) and value >= 0 and math.isfinite(value)),
        "a finite number >= 0",
    ),
    "optimizer.schedule": _one_of("rsqrt", "budget"),
    "optimizer.learning_rate_scale": _POSITIVE_NUMBER,
    "optimizer.decay_floor": _within(0.0, 1.0, closed_high=True),
    "optimizer.warmup_steps": _at_least(1),
    "optimizer.b1": _within(0.0, 1.0),
    "optimizer.b2": _within(0.0, 1.0),
    "optimizer.eps": ((lambda value: _number(value) and value >= 0), "a number >= 0"),
    "optimizer.clip_norm": ((lambda value: _number(value) and value >= 0), "a number >= 0 (0 turns clipping off)"),
    "optimizer.accumulation_steps": _at_least(1),
    "mesh.shape": _MESH_SHAPE,
    "training.seed": _at_least(0),
    "training.init_from": _OPTIONAL_TEXT,
    "training.init_encoder_from": _OPTIONAL_TEXT,
    "training.init_decoder_from": _OPTIONAL_TEXT,
    "training.init_checkpoint": (
        (lambda value: value in CHECKPOINT_KINDS or (str(value).isdigit() and not isinstance(value, bool))),
        "'latest', 'best', 'averaged', 'final' or a step number",
    ),
    "training.num_train_steps": _at_least(1),
    "training.time_budget_minutes": (
        (lambda value: _number(value) and value >= 0 and math.isfinite(value)),
        "a finite number >= 0 (0: no time budget)",
    ),
    "training.label_smoothing": _within(0.0, 1.0),
    "training.loss_chunk_tokens": _at_least(0),
    "training.rdrop_alpha": (
        (lambda value: _number(value) and value >= 0 and math.isfinite(value)),
        "a finite number >= 0 (0: no R-Drop)",
    ),
    "training.rdrop_start": _within(0.0, 1.0),
    "training.rdrop_min_plain_steps": _at_least(0),
    "training.rdrop_decision_step": _at_least(1),
    "training.log_every_steps": _at_least(1),
    "training.eval_every_steps": _at_least(1),
    "training.checkpoint_every_steps": _at_least(1),
    "training.keep_checkpoints": _at_least(1),
    "training.bleu_every_steps": _at_least(0),
    "training.bleu_examples": _at_least(0),
    "training.bleu_method": ((lambda value: value in (None, "greedy", "beam")), "None, 'greedy' or 'beam'"),
    "training.final_choice": ((lambda value: isinstance(value, bool)), "True or False"),
    "training.average_last": _at_least(0),
    "training.final_alphas": (
        (
            lambda value: (
                isinstance(value, (tuple, list))
                and all(_number(alpha) and alpha >= 0 and math.isfinite(alpha) for alpha in value)
            )
        ),
        "a tuple of finite numbers >= 0 (length penalties; () keeps decoding.alpha)",
    ),
    "decoding.method": _one_of("beam", "greedy", "sample"),
    "decoding.beam_size": _at_least(1),
    "decoding.alpha": ((lambda value: _number(value) and value >= 0), "a number >= 0"),
    "decoding.max_extra_length": _at_least(1),
    "decoding.stop": _one_of(*BEAM_STOPS),
    "decoding.batch_size": _at_least(1),
}
