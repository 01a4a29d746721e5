"""What every non-model key of an experiment config allows: one (check, description) rule per key,
then the values of different keys that cannot go together (`check_combinations`), both read by
`experiment.validate` before anything is prepared, compiled or written (the model section is
checked by TransformerConfig). A value of the wrong kind (a bool on a float key, anything but a
tuple on a tuple key) is refused earlier, as it is set: checked_keys."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxformer.data.split_files import plain_text_for_pairs, spec_kind
from jaxformer.decoding.beam_search import ALPHA_RULE, BEAM_STOPS, LENGTH_PENALTIES, is_valid_alpha
from jaxformer.decoding.generate import MAX_EXTRA_LENGTH
from jaxformer.decoding.scoring import BLEU_TOKENIZERS, bleu_tokenizer, bleu_tokenizer_problem
from jaxformer.model.config import ARCHITECTURES, PRESETS, ConfigError
from jaxformer.run.directory import parse_checkpoint_choice
from jaxformer.tokens import NUM_SPECIAL_TOKENS
from jaxformer.training.sharding import check_rules


def _integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: _integer(value) and value >= low), f"an integer >= {low}"


def _from_to(low: int, high: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: _integer(value) and low <= value <= high), f"an integer from {low} to {high}"


def _one_of(*choices: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: value in choices), "one of " + ", ".join(map(repr, choices))


def _within(low: float, high: float, closed_high: bool = False) -> tuple[Callable[[Any], bool], str]:
    if closed_high:
        return (lambda value: _number(value) and low <= value <= high), f"a number in [{low}, {high}]"
    return (lambda value: _number(value) and low <= value < high), f"a number in [{low}, {high})"


def _non_negative(note: str = "", finite: bool = False) -> tuple[Callable[[Any], bool], str]:
    """A number >= 0 (and finite, with `finite`); `note` says what a value such as 0 means."""
    meaning = ("a finite number >= 0" if finite else "a number >= 0") + (f" ({note})" if note else "")
    return (lambda value: _number(value) and value >= 0 and (not finite or math.isfinite(value))), meaning


def _is_alpha(value: Any) -> bool:
    """A length penalty's alpha that its float32 penalty holds at any length (MAX_ALPHA)."""
    return _number(value) and is_valid_alpha(value)


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


# The largest training.seed: the loop passes it to jitted functions, which take a Python int as an
# int32 (jax_enable_x64 is off): 2**31 and up was an OverflowError once the run had started.
MAX_TRAINING_SEED = 2**31 - 1
# The largest data.shuffle_seed: grain's shuffle refuses a seed over 2**32 - 1, once the data is
# prepared and the tokenizer trained.
MAX_SHUFFLE_SEED = 2**32 - 1


def _a_checkpoint_choice(value: Any) -> bool:
    """Whether the loaders read `value` as a checkpoint (run/directory.parse_checkpoint_choice)."""
    try:
        parse_checkpoint_choice(value)
    except (TypeError, ValueError):
        return False
    return True


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
    "data.shuffle_seed": _from_to(0, MAX_SHUFFLE_SEED),
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
    "tokenizer.sampling_alpha": _non_negative(finite=True),
    "optimizer.schedule": _one_of("rsqrt", "budget"),
    "optimizer.learning_rate_scale": _POSITIVE_NUMBER,
    "optimizer.decay_floor": _within(0.0, 1.0, closed_high=True),
    "optimizer.warmup_steps": _at_least(1),
    "optimizer.b1": _within(0.0, 1.0),
    "optimizer.b2": _within(0.0, 1.0),
    "optimizer.eps": _non_negative(finite=True),
    "optimizer.weight_decay": _non_negative("0: plain Adam", finite=True),
    "optimizer.clip_norm": _non_negative("0 turns clipping off", finite=True),
    "optimizer.accumulation_steps": _at_least(1),
    "optimizer.ema_decay": _within(0.0, 1.0),
    "mesh.shape": _MESH_SHAPE,
    "training.seed": _from_to(0, MAX_TRAINING_SEED),
    "training.init_from": _OPTIONAL_TEXT,
    "training.init_encoder_from": _OPTIONAL_TEXT,
    "training.init_decoder_from": _OPTIONAL_TEXT,
    "training.init_checkpoint": (_a_checkpoint_choice, "'latest', 'best', 'averaged', 'final' or a step number"),
    "training.num_train_steps": _at_least(1),
    "training.time_budget_minutes": _non_negative("0: no time budget", finite=True),
    "training.label_smoothing": _within(0.0, 1.0),
    "training.loss_chunk_tokens": _at_least(0),
    "training.rdrop_alpha": _non_negative("0: no R-Drop", finite=True),
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
    "training.bleu_tokenize": (
        (lambda value: value is None or value in BLEU_TOKENIZERS),
        "None (sacreBLEU's choice for data.target_language) or one of " + ", ".join(map(repr, BLEU_TOKENIZERS)),
    ),
    "training.final_choice": ((lambda value: isinstance(value, bool)), "True or False"),
    "training.average_last": _at_least(0),
    "training.final_alphas": (
        (lambda value: isinstance(value, (tuple, list)) and all(_is_alpha(alpha) for alpha in value)),
        f"a tuple of length penalties (() keeps decoding.alpha), each {ALPHA_RULE}",
    ),
    "decoding.method": _one_of("beam", "greedy", "sample"),
    "decoding.beam_size": _at_least(1),
    "decoding.alpha": (_is_alpha, ALPHA_RULE),
    "decoding.max_extra_length": _from_to(1, MAX_EXTRA_LENGTH),
    "decoding.length_penalty": (
        (lambda value: value is None or value in LENGTH_PENALTIES),
        "None (training.init_from's form, else 'gnmt') or one of " + ", ".join(map(repr, LENGTH_PENALTIES)),
    ),
    "decoding.renormalize_after_bans": (
        (lambda value: value is None or isinstance(value, bool)),
        "None (training.init_from's, else False), True or False",
    ),
    "decoding.stop": _one_of(*BEAM_STOPS),
    "decoding.batch_size": _at_least(1),
}


# A preset's fields a model section holds (its vocab_size is the tokenizer's: model_section drops it).
PRESET_SIZES = tuple(field for field in PRESETS["base"] if field != "vocab_size")


def preset_of_sizes(section) -> str | None:
    """The preset whose sizes a model section (or a dict of its fields) holds, every one of them;
    None where it holds another size, or not all of them."""
    if not all(field in section for field in PRESET_SIZES):
        return None
    return next(
        (name for name, values in PRESETS.items() if all(values[field] == section[field] for field in PRESET_SIZES)),
        None,
    )


def preset_held_instead(model) -> str | None:
    """The preset whose sizes a model section labelled another one holds: a config file's
    `config.model.preset = "tiny"` after `model_section("base")` (or default_config()) renamed
    base's sizes, which the model keeps, the section holding every field. None where the section
    holds the named preset's sizes, sizes of none (model_section("base", d_model=256)), or not all
    of them (the named preset gives the rest)."""
    held = preset_of_sizes(model)
    return None if held == model.get("preset", "base") else held


def check_combinations(config, architecture: str) -> None:
    """Raises ConfigError for values of different keys that cannot go together (each key's own
    values passed VALUE_RULES); `architecture` is the config's model.architecture."""
    data = config.data
    if architecture not in ARCHITECTURES:
        raise ConfigError(
            f"config model.architecture={architecture!r}: must be one of {', '.join(map(repr, ARCHITECTURES))}"
        )
    preset_name = config.model.get("preset", "base")  # preset()'s own refusal names no key
    if preset_name not in PRESETS:
        raise ConfigError(f"config model.preset={preset_name!r}: must be one of {', '.join(map(repr, PRESETS))}")
    if (held := preset_held_instead(config.model)) is not None:
        sizes = ", ".join(f"{field}={value!r}" for field, value in PRESETS[held].items() if field in PRESET_SIZES)
        raise ConfigError(
            f"config model.preset={preset_name!r} with {held}'s sizes ({sizes}): setting model.preset changes "
            f"only the name; for {preset_name}'s sizes build the section with model_section({preset_name!r}) "
            f"(then change what you like), or give --config.model.preset={preset_name}; to keep {held}'s sizes "
            f"(as a run started with them resumes), set model.preset = {held!r} or give --config.model.preset={held}"
        )
    if architecture != "encoder_decoder":
        for key, value in (
            ("tokenizer.separate_vocabularies", config.tokenizer.separate_vocabularies),
            ("training.bleu_every_steps", config.training.bleu_every_steps),
            ("training.final_choice", config.training.final_choice),
        ):
            if value:
                raise ConfigError(
                    f"config {key}={value!r} applies to translation (model.architecture='encoder_decoder'), "
                    f"not to model.architecture={architecture!r}"
                )
        if config.optimizer.ema_decay:  # kept at every step and checkpointed: refused, not said unused
            raise ConfigError(
                f"config optimizer.ema_decay={config.optimizer.ema_decay!r}: the moving average is read only by the "
                f"final choice (its candidate 'ema'), which a run with model.architecture={architecture!r} never "
                "makes; use 0"
            )
    sampling = config.tokenizer.sampling_nbest
    if sampling and config.tokenizer.model_type != "unigram" and config.tokenizer.model_path is None:
        raise ConfigError(
            f"config tokenizer.sampling_nbest={sampling}: subword sampling needs n-best segmentations, "
            f"which a unigram model has and tokenizer.model_type={config.tokenizer.model_type!r} has not"
        )
    positions, length = config.model.get("max_positions"), config.data.max_length  # an imported model's limit
    if _integer(positions) and length > positions:  # True and other non-integers: TransformerConfig refuses them
        message = f"rows that long reach positions the model lacks; lower data.max_length to at most {positions}"
        raise ConfigError(f"config data.max_length={length} with model.max_positions={positions}: {message}")
    training = config.training
    if architecture == "encoder_decoder" and (training.bleu_every_steps or training.final_choice):  # BLEU's tokenizer
        tokenize = bleu_tokenizer(data.target_language, training.get("bleu_tokenize"))  # built before any data
        if problem := bleu_tokenizer_problem(tokenize, data.target_language, "--config.training.bleu_tokenize"):
            raise ConfigError(f"config training.bleu_tokenize={training.get('bleu_tokenize')!r}: {problem}")
    if training.final_choice and training.average_last > training.keep_checkpoints:
        raise ConfigError(
            f"config training.average_last={training.average_last} with training.keep_checkpoints="
            f"{training.keep_checkpoints}: the final choice averages kept checkpoints only; keep at least "
            f"{training.average_last}, or lower average_last"
        )
    optimizer = config.optimizer
    if optimizer.schedule != "budget" and optimizer.decay_floor != 0.0:
        raise ConfigError(
            f"config optimizer.decay_floor={optimizer.decay_floor!r} applies to optimizer.schedule='budget', "
            f"not {optimizer.schedule!r}"
        )
    # A time budget ends the run at num_train_steps at the latest: the same cap.
    if optimizer.schedule == "budget" and training.num_train_steps <= optimizer.warmup_steps:
        raise ConfigError(
            f"config training.num_train_steps={training.num_train_steps} ends within optimizer.warmup_steps="
            f"{optimizer.warmup_steps}: the budget schedule would never decay; lower warmup_steps"
        )
    if training.rdrop_alpha > 0 and architecture == "encoder_only":
        raise ConfigError(
            f"config training.rdrop_alpha={training.rdrop_alpha!r}: R-Drop compares two predictions of the "
            "same targets, and a masked LM masks each copy of a row differently; use 0 for 'encoder_only'"
        )
    if training.rdrop_start > 0 and training.rdrop_alpha == 0:
        raise ConfigError(
            f"config training.rdrop_start={training.rdrop_start!r} with training.rdrop_alpha=0: there is no "
            "R-Drop to start; set rdrop_alpha > 0, or rdrop_start=0"
        )
    if training.rdrop_min_plain_steps > 0 and training.rdrop_alpha == 0:
        raise ConfigError(
            f"config training.rdrop_min_plain_steps={training.rdrop_min_plain_steps!r} with "
            "training.rdrop_alpha=0: there is no R-Drop to decide on; set rdrop_alpha > 0, or rdrop_min_plain_steps=0"
        )
    if training.rdrop_min_plain_steps > 0 and training.rdrop_start > 0:
        raise ConfigError(
            f"config training.rdrop_min_plain_steps={training.rdrop_min_plain_steps!r} and "
            f"training.rdrop_start={training.rdrop_start!r} both set: R-Drop starts at a fraction of the run "
            "or where the run's pace decides, not both; set one of them to 0"
        )
    parts = [key for key in ("init_encoder_from", "init_decoder_from") if training.get(key) is not None]
    if parts and training.init_from is not None:
        raise ConfigError(
            f"config training.init_from and training.{parts[0]} both set: a run starts from a whole model "
            "or from pretrained halves, not both"
        )
    if parts and architecture != "encoder_decoder":
        raise ConfigError(
            f"config training.{parts[0]} starts a translator (model.architecture='encoder_decoder'), "
            f"not model.architecture={architecture!r}"
        )
    # Quality is chosen on validation data; a test set is scored once, at the end (evaluate.py).
    for key in ("train_split", "eval_split"):
        if data[key].startswith("test"):
            raise ConfigError(
                f"config data.{key}={data[key]!r} is a test split: a run trains and chooses on its training and "
                f"validation splits; score a test set once, at the end, with jaxformer-evaluate --split {data[key]}"
            )
    if data.eval_split == data.train_split:
        raise ConfigError(
            f"config data.eval_split={data.eval_split!r} is data.train_split too: validation is held out of training"
        )
    if architecture == "encoder_decoder" and data.source_language == data.target_language:
        raise ConfigError(f"config data.source_language and data.target_language are both {data.source_language!r}")
    if data.batch_size % config.optimizer.accumulation_steps:
        raise ConfigError(
            f"config optimizer.accumulation_steps={config.optimizer.accumulation_steps} must divide "
            f"data.batch_size={data.batch_size}"
        )
    if data.input_shards and data.batch_size % data.input_shards:
        raise ConfigError(f"config data.input_shards={data.input_shards} must divide data.batch_size={data.batch_size}")
    given_files = {split: spec for split, spec in data.files.items() if spec is not None}
    if data.name == "parallel_files" and "train" not in given_files:
        raise ConfigError(
            "config data.name='parallel_files' needs data.files.train: a TSV file or a path with {lang} in it, "
            "e.g. --config.data.files.train='corpus/train.{lang}.gz'"
            + (", or a text file of one sentence per line" if config.model.architecture != "encoder_decoder" else "")
        )
    if data.name != "parallel_files" and given_files:
        split = next(iter(given_files))
        raise ConfigError(
            f"config data.files.{split}={given_files[split]!r} applies to data.name='parallel_files' only, "
            f"not {data.name!r}"
        )
    one_language = [split for split, spec in given_files.items() if spec_kind(spec) == "text"]
    if data.name == "parallel_files" and architecture == "encoder_decoder" and one_language:
        setting = f"data.files.{one_language[0]}={given_files[one_language[0]]!r}"
        raise ConfigError(
            f"config {plain_text_for_pairs(setting, one_language[0], (data.source_language, data.target_language))}"
        )
    for rule in config.mesh.logical_axis_rules:
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ConfigError(f"config mesh.logical_axis_rules: {rule!r} is not a (logical name, mesh axes) pair")
    check_rules(config.mesh.logical_axis_rules)
