"""The work of a shortened run's last step, its interim checkpoint's (jaxformer/training/
shortened_end.py): the records metrics.jsonl holds of that step stand for its evaluation and BLEU
where complete and measured alike (the same split, search, tokenizer and best/ score); work measured
otherwise has its records moved aside before the checkpoint takes the new config, and a setting the
BLEU search does not read leaves the records and the checkpoint as they are."""

import json
import types

import pytest


def test_the_last_steps_records_stand_for_its_work_when_complete_and_measured_alike():
    from jaxformer.training.experiment import default_config
    from jaxformer.training.shortened_end import reusable_records

    config = default_config().to_dict()
    evaluation = {"step": 34, "time": 1.0, "eval/loss": 2.5, "eval/perplexity": "inf", "eval/accuracy": 0.3}
    bleu = {"step": 34, "time": 2.0, "eval/bleu": 12.5, "eval/chrf": 30.0, "eval/best_bleu": 14.0}
    train = {"step": 34, "time": 0.5, "train/loss": 2.0}
    due = ["evaluate", "bleu"]
    assert reusable_records(due, [train, evaluation, bleu], config, config, 14.0) == {
        "evaluate": evaluation,
        "bleu": bleu,
    }
    assert reusable_records(["evaluate"], [train, evaluation, bleu], config, config, 14.0) == {"evaluate": evaluation}
    assert reusable_records(due, [train, evaluation], config, config, 14.0) == {"evaluate": evaluation}  # BLEU's lost
    assert reusable_records(due, [train], config, config, 14.0) == {}
    # best/ lacks the step's parameters, which the record says were the best: measured (and saved) again.
    assert reusable_records(due, [evaluation, bleu], config, config, 13.0) == {"evaluate": evaluation}
    other_split = json.loads(json.dumps(config))
    other_split["data"]["eval_split"] = "test"
    assert reusable_records(due, [evaluation, bleu], config, other_split, 14.0) == {}  # both read that split
    beam = json.loads(json.dumps(config))
    beam["decoding"]["beam_size"] += 1
    assert reusable_records(due, [evaluation, bleu], config, beam, 14.0) == {"evaluate": evaluation}


def end_of_shortened_run(workdir, made_with, now):
    """(what end_work did, in order; the records metrics.jsonl keeps) for a run whose interim
    checkpoint at step 34 was saved with the config `made_with`, its evaluation and BLEU recorded,
    ending there with the config `now`."""
    from jaxformer.training.metrics import MetricWriter
    from jaxformer.training.periodic import Periodic
    from jaxformer.training.shortened_end import end_work

    writer = MetricWriter(workdir, enabled=True, start_step=-1)
    writer.write(34, {"loss": 2.5, "perplexity": 12.2, "accuracy": 0.3}, prefix="eval/")
    writer.write(34, {"bleu": 12.5, "best_bleu": 14.0}, prefix="eval/")
    writer.close()
    events = []
    writer = MetricWriter(workdir, enabled=True, start_step=34)

    def moved(step, names, move=writer.move_earlier):
        events.append(("moved", sorted(names)))
        move(step, names)

    writer.move_earlier = moved
    checkpointer = types.SimpleNamespace(replace_metadata=lambda step, metadata: events.append(("config", metadata)))
    saved = types.SimpleNamespace(config=made_with, replace=lambda **changes: changes["config"] is now)
    periodic = [
        Periodic("log", 10, lambda step: events.append("log"), at_last_step=False),
        Periodic("evaluate", 20, lambda step: events.append("evaluate")),
        Periodic("bleu", 20, lambda step: events.append("bleu")),
        Periodic("checkpoint", 20, lambda step: events.append("checkpoint"), saves=True),
    ]
    end_work(periodic, 34, writer, checkpointer, saved, types.SimpleNamespace(config=now), 14.0)
    writer.close()
    return events, [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_work_measured_otherwise_moves_the_records_aside_before_the_checkpoint_takes_the_new_config(tmp_path):
    """Killed after either, the records left in metrics.jsonl are those of the config the checkpoint
    holds; the work whose records stand for it is not done again."""
    from jaxformer.training.experiment import default_config

    made_with = default_config().to_dict()
    now = json.loads(json.dumps(made_with))
    now["decoding"]["beam_size"] += 1  # BLEU measured otherwise, the validation loss alike
    events, kept = end_of_shortened_run(tmp_path, made_with, now)
    assert events == [("moved", ["eval/best_bleu", "eval/bleu"]), ("config", True), "bleu"]
    assert [sorted(record) for record in kept] == [["eval/accuracy", "eval/loss", "eval/perplexity", "step", "time"]]


def test_a_setting_the_bleu_search_does_not_read_leaves_the_records_and_the_checkpoint_as_they_are(tmp_path):
    from jaxformer.training.experiment import default_config

    made_with = default_config().to_dict()
    made_with["training"]["bleu_method"] = "greedy"
    now = json.loads(json.dumps(made_with))
    now["decoding"]["beam_size"] += 1  # read by beam search alone (best/'s score would be kept as well)
    now["decoding"]["length_penalty"] = "transformers"
    events, kept = end_of_shortened_run(tmp_path, made_with, now)
    assert events == []  # nothing moved aside, the checkpoint's config kept, nothing measured again
    assert [sorted(record) for record in kept] == [
        ["eval/accuracy", "eval/loss", "eval/perplexity", "step", "time"],
        ["eval/best_bleu", "eval/bleu", "step", "time"],
    ]


@pytest.mark.parametrize("language, alike", [("de", True), ("ja", False)])
def test_a_bleu_record_from_before_the_tokenizer_key_was_scored_with_13a(language, alike):
    """13a whatever the language, which a Japanese run now leaves for ja-mecab, as best/'s score is
    compared (tests/training/test_run_start_checks.py)."""
    from jaxformer.training.experiment import default_config
    from jaxformer.training.shortened_end import reusable_records

    now = default_config().to_dict()
    now["data"]["target_language"] = language
    made_with = json.loads(json.dumps(now))
    del made_with["training"]["bleu_tokenize"]
    evaluation = {"step": 34, "time": 1.0, "eval/loss": 2.5, "eval/perplexity": "inf", "eval/accuracy": 0.3}
    bleu = {"step": 34, "time": 2.0, "eval/bleu": 12.5, "eval/chrf": 30.0, "eval/best_bleu": 14.0}
    reused = reusable_records(["evaluate", "bleu"], [evaluation, bleu], made_with, now, 14.0)
    assert reused == ({"evaluate": evaluation, "bleu": bleu} if alike else {"evaluate": evaluation})
