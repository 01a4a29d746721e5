"""What every non-model key of an experiment config allows: one (check, description) rule per key,
then the values of different keys that cannot go together (`check_combinations`), both read by
`experiment.validate` before anything is prepared, compiled or written (the model section is
checked by TransformerConfig)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxformer.decoding.generate import MAX_EXTRA_LENGTH
from jaxformer.decoding.scoring import BLEU_TOKENIZERS, bleu_tokenizer, bleu_tokenizer_problem
from jaxformer.decoding.search import BEAM_STOPS, LENGTH_PENALTIES
from jaxformer.errors import with_article
from jaxformer.model.config import ARCHITECTURES, ConfigError
from jaxformer.run.directory import CHECKPOINT_KINDS
from jaxformer.tokens import NUM_SPECIAL_TOKENS
from jaxformer.training.sharding import check_rules


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


def _non_negative(note: str = "", finite: bool = False) -> tuple[Callable[[Any], bool], str]:
    """A number >= 0 (and finite, with `finite`); `note` says what a value such as 0 means."""
    meaning = ("a finite number >= 0" if finite else "a number >= 0") + (f" ({note})" if note else "")
    return (lambda value: _number(value) and value >= 0 and (not finite or math.isfinite(value))), meaning


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
    "training.seed": _at_least(0),
    "training.init_from": _OPTIONAL_TEXT,
    "training.init_encoder_from": _OPTIONAL_TEXT,
    "training.init_decoder_from": _OPTIONAL_TEXT,
    "training.init_checkpoint": (
        (lambda value: value in CHECKPOINT_KINDS or (str(value).isdigit() and not isinstance(value, bool))),
        "'latest', 'best', 'averaged', 'final' or a step number",
    ),
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
    "decoding.alpha": _non_negative(finite=True),
    "decoding.max_extra_length": (
        (lambda value: _integer(value) and 1 <= value <= MAX_EXTRA_LENGTH),
        f"an integer from 1 to {MAX_EXTRA_LENGTH}",
    ),
    "decoding.length_penalty": (
        (lambda value: value is None or value in LENGTH_PENALTIES),
        "None (training.init_from's form, else 'gnmt') or one of " + ", ".join(map(repr, LENGTH_PENALTIES)),
    ),
    "decoding.stop": _one_of(*BEAM_STOPS),
    "decoding.batch_size": _at_least(1),
}


def check_combinations(config, architecture: str) -> None:
    """Raises ConfigError for values of different keys that cannot go together (each key's own
    values passed VALUE_RULES); `architecture` is the config's model.architecture."""
    data = config.data
    if architecture not in ARCHITECTURES:
        raise ConfigError(
            f"config model.architecture={architecture!r}: must be one of {', '.join(map(repr, ARCHITECTURES))}"
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
                    f"not to {architecture!r}"
                )
    sampling = config.tokenizer.sampling_nbest
    if sampling and config.tokenizer.model_type != "unigram" and config.tokenizer.model_path is None:
        raise ConfigError(
            f"config tokenizer.sampling_nbest={sampling}: subword sampling needs n-best segmentations, "
            f"which a unigram model has and tokenizer.model_type={config.tokenizer.model_type!r} has not"
        )
    positions, length = config.model.get("max_positions"), config.data.max_length  # an imported model's limit
    if positions is not None and length > positions:
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
            f"not {with_article(repr(architecture))} model"
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
        )
    if data.name != "parallel_files" and given_files:
        split = next(iter(given_files))
        raise ConfigError(
            f"config data.files.{split}={given_files[split]!r} applies to data.name='parallel_files' only, "
            f"not {data.name!r}"
        )
    for rule in config.mesh.logical_axis_rules:
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ConfigError(f"config mesh.logical_axis_rules: {rule!r} is not a (logical name, mesh axes) pair")
    check_rules(config.mesh.logical_axis_rules)


def unused_settings(config, resuming: bool = False) -> list[str]:
    """Settings of a feature that the config switches off (or leaves without use: the options of
    training a tokenizer when none is trained), each different from default_config's: kept, so
    that switching it back on restores them, and said, so that none is taken for one in effect.
    `resuming`: the workdir's run goes on with its own tokenizers, trained (or not) at its start
    with these very options (a change is refused), so the options are not named."""
    training = config.training
    unused = []
    if training.final_alphas and not training.final_choice:
        unused.append(f"training.final_alphas={tuple(training.final_alphas)} (training.final_choice is False)")
    elif training.final_alphas and config.decoding.method != "beam":
        unused.append(
            f"training.final_alphas={tuple(training.final_alphas)} (decoding.method is {config.decoding.method!r}: "
            "a length penalty ranks beam search's hypotheses only)"
        )
    if training.rdrop_decision_step != 600 and not training.rdrop_min_plain_steps:
        unused.append(
            f"training.rdrop_decision_step={training.rdrop_decision_step} (training.rdrop_min_plain_steps is 0)"
        )
    from jaxformer.training.experiment import default_config  # experiment imports this module

    defaults = default_config()
    data = config.data
    if data.validation_holdout != defaults.data.validation_holdout:
        if data.name != "parallel_files":
            unused.append(
                f"data.validation_holdout={data.validation_holdout} (data.name is {data.name!r}, "
                "whose validation split is its own; only parallel_files holds pairs out)"
            )
        elif data.files.get("validation"):
            unused.append(
                f"data.validation_holdout={data.validation_holdout} (data.files.validation is given: "
                "no pairs are held out)"
            )
    starts = ("init_from", "init_encoder_from", "init_decoder_from")
    if training.init_checkpoint != defaults.training.init_checkpoint and not any(training[key] for key in starts):
        unused.append(
            f"training.init_checkpoint={training.init_checkpoint!r} (no training.init_from, init_encoder_from or "
            "init_decoder_from: the run starts from random values)"
        )
    depth = _missing_stack_depth(config)
    if depth is not None:
        unused.append(depth)
    for key, why in _translation_settings_unused(config):
        section, name = key.split(".")
        if config[section][name] != defaults[section][name]:
            unused.append(f"{key}={config[section][name]!r} ({why})")
    untrained = None if resuming else _tokenizers_not_trained(config)
    if untrained:
        for key in TOKENIZER_TRAINING_KEYS:
            if config.tokenizer[key] != defaults.tokenizer[key]:
                unused.append(f"tokenizer.{key}={config.tokenizer[key]!r} ({untrained})")
    return unused


def _missing_stack_depth(config) -> str | None:
    """The depth of the stack a language model does not have (model.num_encoder_layers of a
    decoder_only model, num_decoder_layers of an encoder_only one), where it differs from its own
    stack's: a config made from a translator's keeps both depths (multi30k_lm.py), and one set
    apart from the other was meant for a stack that is not built."""
    model = config.model
    architecture = model.get("architecture", "encoder_decoder")
    stacks = {"decoder_only": ("encoder", "decoder"), "encoder_only": ("decoder", "encoder")}
    if architecture not in stacks:
        return None
    missing, built = stacks[architecture]
    value, depth = model.get(f"num_{missing}_layers"), model.get(f"num_{built}_layers")
    if value == depth:
        return None
    return (
        f"model.num_{missing}_layers={value!r} (model.architecture is {architecture!r}: no {missing} is built; "
        f"the {built}'s depth is model.num_{built}_layers={depth!r})"
    )


def _translation_settings_unused(config) -> list[tuple[str, str]]:
    """(key, why) for each setting of translating during training (validation BLEU, the final
    choice) that this config never reads."""
    training = config.training
    architecture = config.model.get("architecture", "encoder_decoder")
    if architecture != "encoder_decoder":
        why = f"model.architecture is {architecture!r}: nothing is translated during training"
        keys = [f"decoding.{key}" for key in config.decoding] + [
            "training.bleu_examples",
            "training.bleu_method",
            "training.bleu_tokenize",
            "training.average_last",
        ]
        return [(key, why) for key in keys]
    unused = []
    if not training.bleu_every_steps:
        why = "training.bleu_every_steps is 0"
        unused += [("training.bleu_examples", why), ("training.bleu_method", why)]
    if not training.final_choice:
        unused.append(("training.average_last", "training.final_choice is False"))
        if not training.bleu_every_steps:
            why = "training.bleu_every_steps is 0 and training.final_choice is False: nothing is translated"
            unused += [(f"decoding.{key}", why) for key in config.decoding]
    return unused


# What only training a sentencepiece model reads; tokenizer.vocab_size is not here: a given model
# or a start's tokenizer that contradicts it is an error or replaces it with a note of its own.
TOKENIZER_TRAINING_KEYS = ("model_type", "character_coverage", "max_sentences")


def _tokenizers_not_trained(config) -> str | None:
    """Why no tokenizer of the run is trained (each vocabulary comes from a given model or from a
    start's checkpoint), for a message; None when one is."""

    def giver(*keys: str) -> str | None:  # the first of the keys that is set
        return next((key for key in keys if config[key.split(".")[0]].get(key.split(".")[1]) is not None), None)

    # A start's tokenizer comes with its embeddings: it is the one used, a given model only checked against it.
    starts = ("training.init_from", "training.init_encoder_from", "training.init_decoder_from")
    if not config.tokenizer.separate_vocabularies:
        shared = giver(*starts, "tokenizer.model_path")
        return None if shared is None else f"no tokenizer is trained: {shared} gives the vocabulary"
    source = giver("training.init_from", "training.init_encoder_from", "tokenizer.model_path")
    target = giver("training.init_from", "training.init_decoder_from", "tokenizer.target_model_path")
    if source is None or target is None:
        return None
    if source == target:
        return f"no tokenizer is trained: {source} gives both vocabularies"
    return f"no tokenizer is trained: {source} gives the source vocabulary, {target} the target's"
