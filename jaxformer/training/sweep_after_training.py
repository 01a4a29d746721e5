"""What a sweep's variant must change: how its model is trained. One that changes only what the
final choice reads after the last step (its search, the alphas it compares, how many checkpoints it
averages) would train the parameters of the config as it is again, an hour for multi30k, to decode
them otherwise; jaxformer-evaluate compares such settings on the winner's run without training.
One that changes only settings its run does not use (a switched-off feature's, or a tokenizer's
size and training options where a fine-tuning start gives the tokenizer) would train the config
as it is again, and be ranked as though it had changed something."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxformer.model.config import ConfigError
from jaxformer.training import experiment
from jaxformer.training.final_choice import CHOICE_KEYS
from jaxformer.training.sweep_validation import VALIDATION_KEYS
from jaxformer.training.unused_settings import unused_keys
from jaxformer.training.validation_bleu import bleu_measured_alike

# CHOICE_KEYS but the validation pairs, which evaluation during training reads too (and a sweep
# refuses apart: sweep_validation.py). training.average_last and training.final_alphas are read by
# the final choice alone; the search, decoding.batch_size and training.bleu_tokenize by validation
# BLEU during training too where it runs, which decides what best/ keeps (`_read_alike_in_training`).
FINAL_CHOICE_KEYS = frozenset(CHOICE_KEYS) - frozenset(VALIDATION_KEYS)


def _read_alike_in_training(config: dict[str, Any], reference: dict[str, Any]) -> bool:
    """Whether validation BLEU during training (none where training.bleu_every_steps is 0) scores
    alike, and as fast, under `config` and `reference` (as dicts): the same measure (a beam's
    settings under greedy search are read by none), and the same decoding batches, whose padding
    moves a score by a float or two, enough to change which step best/ keeps."""
    if not reference["training"]["bleu_every_steps"]:
        return True
    same_batches = config["decoding"]["batch_size"] == reference["decoding"]["batch_size"]
    return same_batches and bleu_measured_alike(reference, config)


def after_training_keys(config: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """The keys in which `config` differs from `reference` (configs as dicts) when each of them is
    read after training alone, so that a run with `config` trains the parameters `reference`'s
    would and keeps the same checkpoints; [] when they differ in nothing or in a key training reads."""
    flat, reference_flat = (experiment.as_tuples(experiment.flatten(values)) for values in (config, reference))
    changed = sorted(key for key in flat.keys() | reference_flat.keys() if flat.get(key) != reference_flat.get(key))
    if not set(changed) <= FINAL_CHOICE_KEYS or not _read_alike_in_training(config, reference):
        return []
    return changed


def refuse_after_training_only(
    name: str, overrides: Sequence[str], config: dict[str, Any], reference: dict[str, Any]
) -> None:
    """A ConfigError when variant `name`'s `overrides` change only keys read after training
    (`after_training_keys` of its `config` against the `reference` config, as dicts)."""
    keys = after_training_keys(config, reference)
    if keys:
        raise ConfigError(
            f"variant {name!r}: {', '.join(overrides)} changes only what the final choice reads after training "
            f"({', '.join(keys)}), so its run would train the parameters of the config as it is again; compare "
            "such settings on the winner's run with jaxformer-evaluate --split validation (--beam_size, --alpha, "
            "--checkpoint averaged after jaxformer-average-checkpoints --last N)"
        )


def refuse_unused_only(
    name: str, overrides: Sequence[str], config: ml_collections.ConfigDict, reference: ml_collections.ConfigDict
) -> None:
    """A ConfigError when variant `name`'s `overrides` change only keys that neither its run
    (`config`) nor the config as it is (`reference`) uses (unused_settings.unused_keys)."""
    flat, reference_flat = (
        experiment.as_tuples(experiment.flatten(values.to_dict())) for values in (config, reference)
    )
    changed = sorted(key for key in flat.keys() | reference_flat.keys() if flat.get(key) != reference_flat.get(key))
    unused, unused_there = unused_keys(config), unused_keys(reference)
    if changed and all(key in unused and key in unused_there for key in changed):
        why = "; ".join(f"{key}: {unused[key]}" for key in changed)
        raise ConfigError(
            f"variant {name!r}: {', '.join(overrides)} changes only settings that its run does not use ({why}), "
            "so it would train the config as it is again; remove it, or change what the run uses"
        )
