"""What a run resumed from its workdir may change in its config, and what it may not.

A resumed run compares its config with the one its checkpoint saved (run_start.py): a changed
RESUME_SENSITIVE value is refused, a changed RESUME_FREE value is logged. A sweep (sweep.py)
reuses a finished run only when every key but PLACEMENT_KEYS agrees. A result the run kept from
before (best/'s validation BLEU, final/'s choice) is held to the settings it was made with: a
refusal names those that changed (`changed_settings`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxformer.decoding.generate import DecodeSettings
from jaxformer.model.config import PRESETS
from jaxformer.training import experiment, text_sides
from jaxformer.training.config_paths import PATH_KEYS

# Sections whose values must not change when a run resumes from its workdir: they shape the
# parameters, the optimizer state, the tokenizer or the data order.
RESUME_SENSITIVE = ("model", "data", "tokenizer", "optimizer")
# The training keys that define what the steps compute: a resumed run that changed one would mix
# two runs. The rest of `training` (its length, budget, evaluations, checkpoints, final choice)
# may change on resume; a lowered keep_checkpoints only where it deletes none of the checkpoints the
# run's own value keeps (kept_checkpoints.check_keep_not_lowered).
RESUME_SENSITIVE_KEYS = {
    "training.seed",
    "training.label_smoothing",
    "training.rdrop_alpha",
    "training.rdrop_start",
    "training.rdrop_min_plain_steps",
    "training.rdrop_decision_step",
}
# Keys that may change on resume all the same, each change logged as a warning: where the data is
# read and evaluated from, the schedule's shape, the mesh, the loss's chunking (the same sums in
# other pieces), the remat policy (the same step, what its backward pass recomputes: a run out of
# memory may turn it on to go on), and the starting points of a fine-tuning run (read by its first segment only).
# Paths to the run's own files may name them elsewhere: their contents are what must not change,
# and those are checked apart (the data's fingerprint, a given tokenizer against the workdir's).
RESUME_FREE = {
    *PATH_KEYS,  # the data's and tokenizers' files, and the fine-tuning run's starting points
    "data.download",
    "data.num_threads",
    "data.encode_once_max_examples",
    "data.eval_split",
    "data.max_eval_examples",
    "data.eval_batch_size",
    "optimizer.learning_rate_scale",
    "optimizer.warmup_steps",
    "optimizer.decay_floor",
    "mesh.shape",
    "mesh.logical_axis_rules",
    "model.remat_policy",
    "training.loss_chunk_tokens",
    "training.init_checkpoint",
    "model.preset",  # a name: the model's fields are compared (a section's missing ones its preset's)
}


# The decoding keys whose None means their value before the key existed, each with that value:
# how the model is searched and scored (a --from_hf import says how transformers does it), not a
# choice of this run's. A run's start settles a None one from the run it starts from
# (run_start.settle_inherited_decoding); validation BLEU, best/ and the final choice read one still
# None, or absent in an older run's config, as that value. Here, below validation_bleu and run_start
# (which import this module), so that the resume's comparison reads the same keys.
INHERITED_DECODING = {
    "length_penalty": DecodeSettings.length_penalty,
    "renormalize_after_bans": DecodeSettings.renormalize_after_bans,
}

# Keys whose None the run's start settles: a checkpoint saves the value it settled on, which a
# config that still says None asks for again.
SETTLED_AT_START = {f"decoding.{key}" for key in INHERITED_DECODING}


# Of RESUME_FREE, the keys that say where the data is and how the work is spread, or only name
# what other keys hold (model.preset), not what a run computes: a sweep reuses a finished run whose
# other keys all agree with its variant's.
PLACEMENT_KEYS = {
    "model.preset",
    "data.data_dir",
    "data.raw_dir",
    "data.download",
    "data.num_threads",
    "data.encode_once_max_examples",
    "data.eval_batch_size",
    "mesh.shape",
    "mesh.logical_axis_rules",
    "training.loss_chunk_tokens",
}


def resume_differences(
    saved: dict[str, Any], current: ml_collections.ConfigDict, free: bool = False, sections=RESUME_SENSITIVE
) -> list[str]:
    """'key: saved -> current' for every resume-sensitive value that changed (the `sections`, None
    for all, and RESUME_SENSITIVE_KEYS; with `free`: every RESUME_FREE value, and each of
    text_sides.language_model_unread's for `current`'s architecture, which a resumed run may change and
    reports). A key the saved config lacks (the run was made before the key existed) counts as
    its default, the behaviour that run had; a SETTLED_AT_START key that `current` leaves None
    agrees with any saved value."""

    def flat(config) -> dict[str, Any]:
        return experiment.as_tuples(experiment.flatten(with_preset_fields(config)))

    saved_flat, current_flat = flat(saved), flat(current.to_dict())
    defaults = experiment.as_tuples(experiment.flatten(experiment.default_config()))
    free_keys = RESUME_FREE | set(text_sides.language_model_unread(current))
    differences = []
    for key in sorted(set(saved_flat) | set(current_flat)):
        compared = sections is None or key.split(".")[0] in sections or key in RESUME_SENSITIVE_KEYS
        if free != (key in free_keys) or (not free and not compared):
            continue
        if key in SETTLED_AT_START and current_flat.get(key) is None:
            continue
        was = saved_flat.get(key, defaults.get(key, "<unset>"))
        if was != current_flat.get(key, "<unset>"):
            differences.append(f"{key}: {was!r} -> {current_flat.get(key, '<unset>')!r}")
    return differences


def with_preset_fields(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with each model field its section leaves out at its preset's value, as the model
    is built from it (experiment.model_config): the fields, not the preset's name, are the model. A
    run started before config_rules.preset_held_instead saved a section whose name is another
    preset's than its sizes (`config.model.preset = "tiny"` on base's sizes); the file corrected,
    the same sizes under their own name, it resumes. An unknown name is left to validate."""
    model = config.get("model")
    if not isinstance(model, dict) or model.get("preset", "base") not in PRESETS:
        return config
    return {**config, "model": {**experiment.model_section(model.get("preset", "base")).to_dict(), **model}}


def value_or_before_the_key(key: str, value: Any) -> Any:
    """`value` of the INHERITED_DECODING key decoding.`key`; None: its value before the key existed."""
    return value or INHERITED_DECODING[key]


def kept_setting_values(config: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The `keys` values of a config as a kept result saved it, or as a run has it now; a key the
    config lacks has its default, as the run that lacked it had."""
    flat = {**experiment.flatten(experiment.default_config()), **experiment.as_tuples(experiment.flatten(config))}
    return {key: flat[key] for key in keys}


def changed_settings(
    keys: Sequence[str],
    was: dict[str, Any],
    now: dict[str, Any],
    read_then: dict[str, Any],
    read_now: dict[str, Any],
) -> str:
    """'key=was (now current), ...' for each of `keys` whose value changed in a way the kept result
    reads (`read_then` against `read_now`: `was` and `now` as it reads them): a beam size under
    greedy search changes nothing, and a key unchanged itself but read otherwise through another
    (training.bleu_method None while decoding.method changed) is left to that other."""
    return ", ".join(
        f"{key}={was[key]!r} (now {now[key]!r})"
        for key in keys
        if read_then[key] != read_now[key] and was[key] != now[key]
    )


def trains_further(training: ml_collections.ConfigDict, step: int, train_seconds: float) -> bool:
    """Whether a run resumed at `step`, `train_seconds` into its training, takes another step: its
    training.num_train_steps not reached and its time budget (when set) not spent."""
    budget_spent = bool(training.time_budget_minutes) and train_seconds >= training.time_budget_minutes * 60
    return step < training.num_train_steps and not budget_spent
