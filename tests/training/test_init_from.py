"""Fine-tuning (training.init_from): a new run starts from another run's parameters and tokenizer,
with a fresh optimizer, step and data order."""

import dataclasses
import json
import logging
import pathlib
import shutil
import types

import jax
import numpy as np
import pytest

from jaxformer.commands.run_summary import run_summary
from jaxformer.errors import CheckpointError
from jaxformer.model.config import ConfigError, preset
from jaxformer.model.transformer import Transformer, stack_layers, unstack_layers
from jaxformer.run import loading
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint, locate_checkpoint
from jaxformer.training import budget, loop
from jaxformer.training.config_file import load_config_file
from jaxformer.training.init_from import load_starting_points
from jaxformer.training.loop import train_and_evaluate
from tests.run.test_checkpoint_integrity import flip_bit
from tests.training.test_loop import losses

ROOT = pathlib.Path(__file__).parents[2]
pytestmark = pytest.mark.xdist_group("init-from")  # one source run for the module


def tiny_config(data_dir, **training):
    config = load_config_file(ROOT / "jaxformer" / "configs" / "tiny.py")
    config.data.data_dir = str(data_dir)
    config.data.batch_size = 8  # one row per simulated device
    # One layer per stack: every parameter kind is in layer_0, and the run compiles faster.
    config.model.num_encoder_layers = config.model.num_decoder_layers = 1
    config.training.update(training)
    return config


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, data_dir):
    workdir = tmp_path_factory.mktemp("source")
    train_and_evaluate(
        tiny_config(data_dir, num_train_steps=10, eval_every_steps=10, checkpoint_every_steps=5), workdir
    )
    return workdir


@pytest.mark.slow  # a second run, fine-tuned from the first
def test_fine_tuning_starts_from_the_source_model(source_run, data_dir, tmp_path):
    workdir = tmp_path / "tuned"
    config = tiny_config(data_dir, num_train_steps=3, eval_every_steps=3, checkpoint_every_steps=3)
    config.training.init_from = str(source_run)
    train_and_evaluate(config, workdir)

    # Its first evaluation, before any step, is the source model's on the same data.
    source_eval, tuned_eval = losses(source_run, "eval/loss"), losses(workdir, "eval/loss")
    assert sorted(tuned_eval) == [0, 3]
    assert tuned_eval[0] == pytest.approx(source_eval[10], rel=1e-6, abs=1e-6)
    for key in ("eval/accuracy", "eval/perplexity"):
        assert losses(workdir, key)[0] == pytest.approx(losses(source_run, key)[10], rel=1e-6)
    # The same tokenizer; a fresh optimizer (the warmup starts again) and step counter.
    assert (workdir / "tokenizer.model").read_bytes() == (source_run / "tokenizer.model").read_bytes()
    source_lr, tuned_lr = losses(source_run, "train/learning_rate"), losses(workdir, "train/learning_rate")
    assert tuned_lr[1] == pytest.approx(source_lr[1])
    step, metadata, params = load_checkpoint(workdir)
    assert step == 3 and metadata.config["training"]["init_from"] == str(source_run)
    _, _, source_params = load_checkpoint(source_run)
    moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(source_params))]
    assert any(moved)  # it trained from there
    # The source run is untouched.
    assert sorted(p.name for p in (source_run / "checkpoints").iterdir() if p.name.isdigit()) == ["10", "5"]

    # Running again resumes the fine-tuning run from its own checkpoint; the start is not reloaded.
    config.training.num_train_steps = 4
    last = train_and_evaluate(config, workdir)
    assert last["step"] == 4 and sorted(losses(workdir, "eval/loss")) == [0, 3, 4]


@pytest.mark.slow  # about 40 s: a fine-tuning run with validation BLEU and the final choice, continued
def test_best_and_the_final_choice_keep_the_start_when_fine_tuning_makes_it_worse(
    source_run, data_dir, tmp_path, monkeypatch
):
    """Validation BLEU at step 0 (before any step) keeps the start in best/, a candidate of the
    final choice; a learning rate 500 times the tiny config's wrecks the model at its first steps.
    The step-0 evaluation is spent from the time budget as any evaluation is: on the budget's clock
    it takes 1,000 s more than it does."""
    workdir = tmp_path / "tuned"
    config = tiny_config(data_dir, num_train_steps=4, eval_every_steps=2, checkpoint_every_steps=2)
    config.training.update(bleu_every_steps=2, bleu_examples=16, bleu_method="greedy", final_choice=True)
    config.training.update(average_last=2, init_from=str(source_run), time_budget_minutes=60)
    config.data.max_eval_examples, config.decoding.max_extra_length = 16, 8
    config.optimizer.learning_rate_scale = 1000.0
    slowed, evaluate = [0.0], loop._evaluate

    def evaluate_slowly_at_first(*args):
        slowed[0] = slowed[0] or 1000.0  # the first: step 0's
        return evaluate(*args)

    real_clock = budget.time.monotonic
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(monotonic=lambda: real_clock() + slowed[0]))
    monkeypatch.setattr(loop, "_evaluate", evaluate_slowly_at_first)
    last = train_and_evaluate(config, workdir)
    assert 1000 < last["train_seconds"] < 1600 and min(losses(workdir, "budget/seconds").values()) > 1000

    bleu = losses(workdir, "eval/bleu")
    assert sorted(bleu) == [0, 2, 4] and sorted(losses(workdir, "eval/loss")) == [0, 2, 4]
    assert max(bleu[2], bleu[4]) < bleu[0]  # the premise: the steps made it worse
    assert losses(workdir, "eval/best_bleu") == {step: bleu[0] for step in bleu}
    _, _, source_params = load_checkpoint(source_run)
    best_step, best_metadata, best_params = load_checkpoint(workdir, "best")
    assert best_step == 0 and best_metadata.bleu == bleu[0]
    for kept, start in zip(jax.tree.leaves(best_params), jax.tree.leaves(source_params), strict=True):
        np.testing.assert_array_equal(kept, start)
    # The final choice scored best/ (the start) with the others and kept the highest.
    scores = {name: last["final"][f"{name}/bleu"] for name in ("latest", "best", "averaged")}
    assert last["final"]["chosen"] == max(scores, key=scores.get) == "best"
    summary = run_summary(config, workdir, last, 1.0)  # what jaxformer-train logs at the end
    assert (
        f"best validation BLEU: {bleu[0]:.2f} at step 0, the start (training.init_from): no step scored higher"
        in summary
    )
    assert any(line.startswith("final choice: best (the start, step 0), ") for line in summary)

    # Continued: step 0 is neither measured nor logged again, and best/ still holds the start.
    config.training.num_train_steps = 6
    train_and_evaluate(config, workdir)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(record) for record in records if record["step"] == 0] == [
        ["eval/accuracy", "eval/loss", "eval/nll", "eval/perplexity", "step", "time"],
        ["eval/best_bleu", "eval/bleu", "eval/chrf", "eval/lowercase_bleu", "step", "time"],
    ]
    assert sorted(losses(workdir, "eval/bleu")) == [0, 2, 4, 6]
    assert load_checkpoint(workdir, "best", params=False)[0] == 0


def test_a_step_directory_and_a_step_number_name_the_same_start(source_run):
    training = tiny_config(".").training
    training.init_from = str(source_run / "checkpoints" / "5")
    (by_directory,) = load_starting_points(training)
    training.init_from, training.init_checkpoint = str(source_run), "5"
    (by_number,) = load_starting_points(training)
    training.init_checkpoint = "latest"
    (latest,) = load_starting_points(training)
    assert by_directory.step == by_number.step == 5 and latest.step == 10
    for a, b in zip(jax.tree.leaves(by_directory.params), jax.tree.leaves(by_number.params)):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, c) for a, c in zip(jax.tree.leaves(by_number.params), jax.tree.leaves(latest.params))
    )


def test_a_start_from_a_final_choice_the_run_trained_past_is_named_as_translate_names_it(
    source_run, tmp_path, monkeypatch, caplog
):
    """init_checkpoint final, the final/ folder or a step in it: the warning that translate and
    export give for --checkpoint final of a run that trained past its choice."""
    workdir = tmp_path / "source"
    shutil.copytree(source_run, workdir)
    _, metadata, params = load_checkpoint(workdir, 5)
    writer = Checkpointer(RunDirectory(workdir).final, keep=None)
    writer.save_params(5, params, metadata.replace(chosen_from="latest", bleu=1.0))
    writer.close()
    training = tiny_config(".").training
    for init_from, choice in ((workdir, "final"), (workdir / "final", "latest"), (workdir / "final" / "5", "latest")):
        monkeypatch.setattr(loading, "_REPORTED_TRAINED_PAST", set())  # said once per process
        training.init_from, training.init_checkpoint = str(init_from), choice
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            (start,) = load_starting_points(training)
        assert start.step == 5
        assert [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING] == [
            f"the final choice of {workdir} was made at step 5, and the run trained past it, to step 10; running "
            "its training command again makes the choice at the run's end (until then, final is step 5's)"
        ]

    # Damaged, that choice was refused in words without translate's remedy: the same words now.
    flip_bit(workdir / "final" / "5", 0.5)
    with pytest.raises(CheckpointError) as translated:
        load_checkpoint(workdir, "final")
    assert "running the run's training command again makes the choice again" in str(translated.value)
    for init_from, choice in ((workdir, "final"), (workdir / "final", "latest"), (workdir / "final" / "5", "latest")):
        training.init_from, training.init_checkpoint = str(init_from), choice
        with pytest.raises(CheckpointError) as started:
            load_starting_points(training)
        chosen = "" if choice == "latest" else " (training.init_checkpoint='final')"
        assert str(started.value) == f"training.init_from{chosen}: {translated.value}"
    training.init_from, training.init_checkpoint = str(workdir / "final"), "7"  # missing, not damaged: no remedy
    with pytest.raises(CheckpointError, match=r"final has no checkpoint for step 7; it has \[5\]$"):
        load_starting_points(training)


def test_latest_skips_a_damaged_newest_step_as_translate_does(source_run, tmp_path, caplog):
    """A run's damaged newest checkpoint: "latest" starts from the newest that reads, with
    load_checkpoint's warning; the damaged step, named, is still refused."""
    workdir = tmp_path / "source"
    shutil.copytree(source_run, workdir)
    flip_bit(workdir / "checkpoints" / "10", 0.9)  # in the parameters (the optimizer state comes first)
    training = tiny_config(".").training
    training.init_from = str(workdir)
    with caplog.at_level(logging.WARNING):
        (start,) = load_starting_points(training)
    assert start.step == 5 and start.where == f"step 5 of {workdir / 'checkpoints'}"
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"checkpoint 10 of {workdir / 'checkpoints'} is damaged")
    assert warnings[0].endswith("; using step 5")
    for training.init_from, training.init_checkpoint in (
        (str(workdir), "10"),
        (str(workdir / "checkpoints" / "10"), "latest"),
    ):
        with pytest.raises(CheckpointError, match="checkpoints/10 is damaged"):
            load_starting_points(training)


def test_a_run_translates_during_training_with_the_length_penalty_of_the_run_it_starts_from(source_run, caplog):
    """decoding.length_penalty and decoding.renormalize_after_bans left None: a resumed run's saved
    ones; a fine-tuning run's start's, logged (a --from_hf import's length penalty is transformers:
    tests/interop/test_marian.py); else gnmt and False."""
    from jaxformer.training.run_start import settle_inherited_decoding

    # The source run settled its Nones at its start and saved them with every checkpoint.
    (point,) = load_starting_points(tiny_config(".", init_from=str(source_run)).training)
    assert point.metadata.config["decoding"]["length_penalty"] == "gnmt"
    assert point.metadata.config["decoding"]["renormalize_after_bans"] is False
    transformers_run = point.metadata.config | {
        "decoding": point.metadata.config["decoding"]
        | {"length_penalty": "transformers", "renormalize_after_bans": True}
    }
    start = dataclasses.replace(point, metadata=point.metadata.replace(config=transformers_run))

    def settled(form, renormalize=None, saved=None, start=None):
        config = tiny_config(".")
        config.decoding.length_penalty, config.decoding.renormalize_after_bans = form, renormalize
        settle_inherited_decoding(config, saved, start)
        return config.decoding.length_penalty, config.decoding.renormalize_after_bans

    with caplog.at_level(logging.INFO, logger="jaxformer.training.run_start"):
        assert settled(None, start=start) == ("transformers", True)
    assert [record.getMessage() for record in caplog.records if record.name.endswith("run_start")] == [
        "decoding.length_penalty=transformers, decoding.renormalize_after_bans=True (validation BLEU, best/ and "
        f"the final choice): those of {point.where}, training.init_from; set a key to choose another"
    ]
    # From scratch: gnmt and False, as before the keys.
    assert settled(None, start=point) == ("gnmt", False) and settled(None) == ("gnmt", False)
    assert settled("gnmt", False, start=start) == ("gnmt", False)  # set: kept
    assert settled("gnmt", start=start) == ("gnmt", True)  # each key left None is settled on its own
    # Resumed: the values its checkpoint saved (those of a run before the keys: gnmt, False); set: the new ones.
    assert settled(None, saved=start.metadata) == ("transformers", True)
    before_the_key = {**point.metadata.config, "decoding": {"method": "beam"}}
    assert settled(None, saved=point.metadata.replace(config=before_the_key)) == ("gnmt", False)
    assert settled("gnmt", False, saved=start.metadata) == ("gnmt", False)


def test_a_model_of_another_shape_is_one_error_listing_the_parameters(source_run):
    """What the model section's check does not see (here: it is bypassed) the parameters still show."""
    from jaxformer.training.init_from import starting_overrides
    from jaxformer.training.state import init_params

    (point,) = load_starting_points(tiny_config(".", init_from=str(source_run)).training)
    config = point.metadata.model_config().replace(d_ff=48)
    abstract = jax.eval_shape(lambda: init_params(Transformer(config), jax.random.key(0), 8, 8))
    with pytest.raises(ConfigError) as error:
        starting_overrides([point], abstract, config)
    message = str(error.value)
    assert "\n" not in message and "do not fit this model" in message
    assert "encoder/layer_0/feed_forward" in message and "(32, 64) in the checkpoint, (32, 48) here" in message


def test_locate_checkpoint_accepts_a_workdir_a_kind_or_a_step_directory(tmp_path):
    workdir = tmp_path / "run"
    (workdir / "checkpoints" / "20").mkdir(parents=True)
    (workdir / "best" / "15").mkdir(parents=True)
    assert locate_checkpoint(workdir) == (workdir / "checkpoints", None)
    assert locate_checkpoint(workdir, "best") == (workdir / "best", None)
    assert locate_checkpoint(workdir, "20") == (workdir / "checkpoints", 20)
    assert locate_checkpoint(workdir / "best") == (workdir / "best", None)
    assert locate_checkpoint(workdir / "checkpoints" / "20") == (workdir / "checkpoints", 20)
    with pytest.raises(CheckpointError, match="no 'averaged' checkpoint"):
        locate_checkpoint(workdir, "averaged")
    with pytest.raises(CheckpointError) as missing:  # translate's, evaluate's and export's: with what makes one
        load_checkpoint(workdir, "averaged")
    assert str(missing.value).endswith(f": jaxformer-average-checkpoints --workdir {workdir} --last N makes one")
    with pytest.raises(CheckpointError, match="does not exist"):
        locate_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="is not a jaxformer workdir"):
        locate_checkpoint(tmp_path)


def test_stack_layers_inverts_unstack_layers():
    config = preset("tiny", vocab_size=50, scan_layers=True)
    tokens = np.ones((1, 4), np.int32)
    scanned = Transformer(config).init(jax.random.key(0), tokens, tokens)["params"]
    plain = unstack_layers(scanned)
    assert "layer_1" in plain["encoder"] and "layers" not in plain["encoder"]
    restacked = stack_layers(plain)
    assert jax.tree.structure(restacked) == jax.tree.structure(scanned)
    for a, b in zip(jax.tree.leaves(restacked), jax.tree.leaves(scanned)):
        np.testing.assert_array_equal(a, b)


def test_a_start_that_does_not_fit_is_refused_before_any_data_is_read(source_run, data_dir, tmp_path, monkeypatch):
    """The model fields its parameters were trained for, the architecture, the key in the message;
    checked before data preparation (refused here by a stand-in) and leaving no workdir behind."""
    from jaxformer.training import run_start

    def no_data(*args, **kwargs):
        raise AssertionError("data was prepared before the starting point was checked")

    monkeypatch.setattr(run_start, "prepare_data", no_data)
    refusals = [
        (
            {"model.activation": "gelu", "model.normalization": "pre", "model.position_layout": "halves"},
            r"training.init_from: step 10 of .*checkpoints was trained with another model section; set it as in "
            r"that run: model.activation='relu' there, 'gelu' here; model.normalization='post' there, 'pre' here; "
            r"model.position_layout='interleaved' there, 'halves' here$",
        ),
        ({"model.d_ff": 48}, r"model.d_ff=64 there, 48 here$"),
        ({"model.max_positions": 64}, r"model.max_positions=None there, 64 here$"),  # an imported model's limit
        (  # one error for the vocabularies' layout, too (it came after the data, one key at a time)
            {"model.share_embeddings": False, "tokenizer.separate_vocabularies": True},
            r"model.share_embeddings=True there, False here; tokenizer.separate_vocabularies=False there, True here$",
        ),
        (
            {"model.architecture": "decoder_only"},
            r"training.init_from: step 10 of .* holds an encoder_decoder model and this run has "
            r"model.architecture='decoder_only'$",
        ),
        ({"training.init_checkpoint": "averaged"}, r"^training.init_from \(training.init_checkpoint='averaged'\): "),
    ]
    for changes, message in refusals:
        config = tiny_config(data_dir, init_from=str(source_run))
        for key, value in changes.items():
            section, field = key.split(".")
            config[section][field] = value
        workdir = tmp_path / "refused"
        with pytest.raises((ConfigError, CheckpointError), match=message):
            train_and_evaluate(config, workdir)
        assert not workdir.exists()
    config = tiny_config(data_dir, init_from=str(tmp_path / "nowhere"))
    with pytest.raises(CheckpointError, match=rf"^training.init_from: {tmp_path / 'nowhere'} does not exist$"):
        train_and_evaluate(config, tmp_path / "refused")


def test_a_start_from_another_language_pair_is_named(source_run, caplog):
    from jaxformer.training.init_from import check_starting_points

    config = tiny_config(".", init_from=str(source_run))
    points = load_starting_points(config.training)

    def warnings():
        return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]

    caplog.clear()
    check_starting_points(points, config)
    assert warnings() == []
    config.data.source_language, config.data.target_language = "de", "en"  # the source run's, reversed
    check_starting_points(points, config)
    warnings = warnings()
    assert len(warnings) == 2 and "read source_language='en', and this run reads 'de'" in warnings[0]
