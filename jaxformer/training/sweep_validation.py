"""What a sweep's rows are compared on: every variant's final choice, and every seed's, scored on
the same validation pairs. A variant that changes them (other data, another split or subset, the
other direction) would rank its BLEU against scores over other sentences."""

from __future__ import annotations

from typing import Any

import ml_collections

from jaxformer.model.config import ConfigError

# The keys that say which pairs a run's final choice is scored on: variants must agree on them, or
# their rows compare BLEU over different sentences. Held-out pairs (parallel_files without a
# validation file) depend on the training files, the holdout's size and the shuffle seed too.
VALIDATION_KEYS = (
    "data.name",
    "data.raw_dir",
    "data.files.validation",
    "data.eval_split",
    "data.max_eval_examples",
    "data.source_language",
    "data.target_language",
)
HOLDOUT_KEYS = ("data.files.train", "data.validation_holdout", "data.shuffle_seed")


def _value(config: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        config = (config or {}).get(part)
    return config


def _holds_out_validation(config: dict[str, Any]) -> bool:
    return _value(config, "data.name") == "parallel_files" and not _value(config, "data.files.validation")


def validation_keys(reference: dict[str, Any]) -> tuple[str, ...]:
    """The keys on which a config must agree with `reference` (as a dict) to be scored on its pairs."""
    return VALIDATION_KEYS + (HOLDOUT_KEYS if _holds_out_validation(reference) else ())


def validation_differences(config: dict[str, Any], reference: dict[str, Any], ignored=frozenset()) -> list[str]:
    """'key: config's value -> reference's' for each key but `ignored` that makes `config` (as a
    dict) score its final choice on other validation pairs than `reference`."""
    return [
        f"{key}: {_value(config, key)!r} -> {_value(reference, key)!r}"
        for key in validation_keys(reference)
        if key not in ignored and _value(config, key) != _value(reference, key)
    ]


def validation_record(config: dict[str, Any]) -> dict[str, Any]:
    """What a sweep row keeps of the config (as a dict, its paths absolute) its run was scored with:
    the value of every key that can say which validation pairs, by dotted key. A later invocation
    checks the row against its variants' with it, when the run's folder may be gone."""
    return {key: _value(config, key) for key in VALIDATION_KEYS + HOLDOUT_KEYS}


def recorded_config(record: dict[str, Any]) -> dict[str, Any]:
    """A `validation_record` as the config dict it was taken from (its dotted keys as sections),
    for validation_differences."""
    config: dict[str, Any] = {}
    for dotted, value in record.items():
        *sections, leaf = dotted.split(".")
        section = config
        for name in sections:
            section = section.setdefault(name, {})
        section[leaf] = value
    return config


def refuse_other_validation_pairs(name: str, config: dict[str, Any], reference: dict[str, Any]) -> None:
    """A ConfigError when variant `name`'s config (as a dict) would score its final choice on other
    validation pairs than the `reference` config: other data, split, subset or languages."""
    for key in validation_keys(reference):
        if _value(config, key) != _value(reference, key):
            raise ConfigError(
                f"variant {name!r}: {key}={_value(config, key)!r} (the others: {_value(reference, key)!r}) changes "
                "the validation pairs its final choice is scored on, so its BLEU would not compare with the "
                "other variants'; a sweep varies how a model is trained, on one validation set"
            )


def check_seeds_share_validation(reference: ml_collections.ConfigDict, seeds: int) -> None:
    """A ConfigError when `seeds` > 1 would score each seed on other validation pairs: seed k moves
    data.shuffle_seed, which draws the pairs parallel_files holds out without a validation file."""
    if seeds > 1 and _holds_out_validation(reference.to_dict()):
        raise ConfigError(
            f"--seeds {seeds}: seed k moves data.shuffle_seed, which draws the validation pairs held out of "
            "data.files.train (data.validation_holdout), so each seed would be scored on other pairs; "
            "set data.files.validation, or run one seed"
        )
