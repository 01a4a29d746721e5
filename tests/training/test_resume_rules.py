"""resume_rules: the config keys a resumed run may change (reported) and those it may not (refused),
a run saved before a key existed resumed at that key's default, and the kept results' settings
named where they changed."""

import json

import pytest

from jaxformer.training import experiment, final_choice, resume_rules
from tests.training.test_experiment import load


def test_resume_differences_name_changed_keys():
    saved = json.loads(json.dumps(load("tiny").to_dict()))  # as a checkpoint stores it: tuples as lists
    assert resume_rules.resume_differences(saved, load("tiny"), free=True) == []
    current = load("tiny")
    current.training.num_train_steps = 999  # allowed
    current.optimizer.learning_rate_scale = 0.5  # allowed
    current.data.data_dir = "/elsewhere"  # allowed
    assert resume_rules.resume_differences(saved, current) == []
    assert resume_rules.resume_differences(saved, current, free=True) == [  # what the resumed run logs
        "data.data_dir: None -> '/elsewhere'",
        "optimizer.learning_rate_scale: 2.0 -> 0.5",
    ]
    current.model.num_heads = 2
    current.tokenizer.vocab_size = 500
    assert resume_rules.resume_differences(saved, current) == [
        "model.num_heads: 4 -> 2",
        "tokenizer.vocab_size: 1000 -> 500",
    ]


def test_a_resume_may_turn_remat_on_but_not_change_the_layout_or_the_dtype():
    """A run out of memory could not resume with model.remat_policy='full' ('none' -> 'full'
    refused), though remat recomputes the same step; scan_layers (the parameters' layout) and the
    dtype (the numerics) still may not change."""
    saved = json.loads(json.dumps(load("tiny").to_dict()))
    current = load("tiny")
    current.model.remat_policy = "full"
    assert resume_rules.resume_differences(saved, current) == []
    assert resume_rules.resume_differences(saved, current, free=True) == ["model.remat_policy: 'none' -> 'full'"]
    current.model.scan_layers, current.model.dtype = True, "bfloat16"
    assert resume_rules.resume_differences(saved, current) == [
        "model.dtype: 'float32' -> 'bfloat16'",
        "model.scan_layers: False -> True",
    ]


def test_a_resume_refuses_training_values_that_change_what_the_steps_compute():
    saved = json.loads(json.dumps(load("tiny").to_dict()))
    current = load("tiny")
    current.training.label_smoothing, current.training.rdrop_alpha, current.training.seed = 0.2, 1.0, 5
    current.training.eval_every_steps, current.training.time_budget_minutes = 7, 3.0  # the run's length and checks
    assert resume_rules.resume_differences(saved, current) == [
        "training.label_smoothing: 0.1 -> 0.2",
        "training.rdrop_alpha: 0.0 -> 1.0",
        "training.seed: 0 -> 5",
    ]
    # A fine-tuning start is read by a run's first segment only: a change is reported, not refused.
    current = load("tiny")
    current.training.init_from = "/runs/base"
    assert resume_rules.resume_differences(saved, current) == []
    assert resume_rules.resume_differences(saved, current, free=True) == ["training.init_from: None -> '/runs/base'"]


def test_a_run_saved_before_a_key_existed_resumes_at_that_keys_default():
    saved = load("tiny").to_dict()
    for key in ("position_layout", "logits_bias"):  # model options added after such runs were made
        del saved["model"][key]
    del saved["optimizer"]["clip_norm"]
    current = load("tiny")
    assert resume_rules.resume_differences(saved, current) == []
    current.model.logits_bias = True  # a behaviour the saved run did not have
    current.optimizer.clip_norm = 0.5
    assert resume_rules.resume_differences(saved, current) == [
        "model.logits_bias: False -> True",
        "optimizer.clip_norm: 1.0 -> 0.5",
    ]


def test_a_presets_name_alone_is_no_change_of_model_its_fields_are():
    """A run started before config_rules.preset_held_instead could save tiny's sizes under base's
    name (`config.model.preset = "base"` after model_section("tiny")); its file corrected to name
    them tiny, it resumed as 'another configuration' (model.preset: 'base' -> 'tiny'), and its
    checkpoints of either name were not one run's for averaging. The name is logged; a section's
    fields, those it leaves out at its preset's value, are compared."""
    saved = json.loads(json.dumps(load("tiny").to_dict()))
    saved["model"]["preset"] = "base"
    current = load("tiny")
    assert resume_rules.resume_differences(saved, current) == []
    assert resume_rules.resume_differences(saved, current, free=True) == ["model.preset: 'base' -> 'tiny'"]
    assert final_choice.run_config_differences(saved, current.to_dict()) == []  # averaging's comparison
    current.model.d_model = 64
    assert resume_rules.resume_differences(saved, current) == ["model.d_model: 32 -> 64"]
    # A section that leaves a size out has its preset's: the name then says the size.
    saved["model"]["preset"] = "tiny"
    del saved["model"]["d_ff"], saved["model"]["num_heads"]
    current = load("tiny")
    assert resume_rules.resume_differences(saved, current) == []
    saved["model"]["preset"] = "base"
    assert resume_rules.resume_differences(saved, current) == ["model.d_ff: 2048 -> 64", "model.num_heads: 8 -> 4"]


def test_a_kept_result_names_the_settings_it_reads_that_changed():
    keys = ("decoding.method", "decoding.beam_size", "training.bleu_method", "training.bleu_examples")
    saved = load("tiny").to_dict()
    del saved["training"]["bleu_examples"]  # a run from before the key: its default
    current = load("tiny")
    current.decoding.update(method="greedy", beam_size=2)
    current.training.bleu_examples = 4
    was = resume_rules.kept_setting_values(saved, keys)
    now = resume_rules.kept_setting_values(current.to_dict(), keys)
    assert was["training.bleu_examples"] == experiment.default_config().training.bleu_examples
    assert now == {**was, "decoding.method": "greedy", "decoding.beam_size": 2, "training.bleu_examples": 4}

    def read(values):  # as a validation search reads them: bleu_method None is decoding.method's
        method = values["training.bleu_method"] or values["decoding.method"]
        return {
            **values,
            "training.bleu_method": method,
            "decoding.beam_size": values["decoding.beam_size"] * (method == "beam"),
        }

    assert resume_rules.changed_settings(keys, was, now, read(was), read(now)) == (
        "decoding.method='beam' (now 'greedy'), decoding.beam_size=4 (now 2), "
        f"training.bleu_examples={was['training.bleu_examples']!r} (now 4)"
    )  # not training.bleu_method: None both times, read otherwise through decoding.method
    greedy = {**now, "decoding.beam_size": 4}  # a beam size greedy search does not read
    assert resume_rules.changed_settings(keys, now, greedy, read(now), read(greedy)) == ""


def test_a_length_penalty_left_none_agrees_with_the_one_a_run_settled_on():
    config = load("multi30k")
    saved = config.to_dict()
    saved["decoding"]["length_penalty"] = "transformers"
    saved["decoding"]["renormalize_after_bans"] = True
    assert resume_rules.resume_differences(saved, config, sections=None) == []
    config.decoding.length_penalty = "gnmt"
    config.decoding.renormalize_after_bans = False
    differences = resume_rules.resume_differences(saved, config, sections=None)
    assert "decoding.length_penalty: 'transformers' -> 'gnmt'" in differences
    assert "decoding.renormalize_after_bans: True -> False" in differences


@pytest.mark.parametrize(
    ("name", "unread"),
    [
        ("multi30k_lm", {"data.source_language": "fr", "model.num_encoder_layers": 6}),
        ("multi30k_mlm", {"data.target_language": "fr", "model.num_decoder_layers": 6}),
    ],
)
def test_a_language_model_resumes_with_another_value_of_a_key_it_never_reads(name, unread):
    """A causal LM's data.source_language and model.num_encoder_layers (a masked LM's
    target_language and num_decoder_layers) are read by nothing, and its start names the depth
    unused: a resume that changed either was refused ("restore these values: model.num_encoder_layers:
    3 -> 6"). It is reported as the other free keys are; the language it reads still may not change."""
    saved = json.loads(json.dumps(load(name).to_dict()))
    current = load(name)
    for key, value in unread.items():
        section, field = key.split(".")
        current[section][field] = value
    assert resume_rules.resume_differences(saved, current) == []
    was = {key: experiment.flatten(load(name))[key] for key in unread}
    assert resume_rules.resume_differences(saved, current, free=True) == [
        f"{key}: {was[key]!r} -> {value!r}" for key, value in sorted(unread.items())
    ]
    read = "target_language" if name == "multi30k_lm" else "source_language"
    current.data[read] = "fr"
    assert resume_rules.resume_differences(saved, current) == [f"data.{read}: {saved['data'][read]!r} -> 'fr'"]
    translator = load("multi30k")  # a translator reads both languages and builds both stacks
    saved = json.loads(json.dumps(translator.to_dict()))
    translator.data.source_language, translator.model.num_encoder_layers = "fr", 6
    assert resume_rules.resume_differences(saved, translator) == [
        "data.source_language: 'en' -> 'fr'",
        "model.num_encoder_layers: 3 -> 6",
    ]
