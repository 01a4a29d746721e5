"""A translator (or a language model) started from a language model's run. With
training.init_checkpoint=best or final: a language model's run never keeps either (its training
refuses validation BLEU and the final choice), so the refusal says so and names what to choose,
instead of advising the settings that keep them, which that run's training refuses. A language
model started from one is compared with it on the one language both read."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.commands import evaluate as evaluate_command
from jaxformer.commands import export as export_command
from jaxformer.commands import translate as translate_command
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.errors import CheckpointError
from jaxformer.model.architectures import build_model
from jaxformer.model.config import ConfigError, preset
from jaxformer.training import experiment
from jaxformer.training.init_from import check_starting_points, load_starting_points
from tests.conftest import read_raw, save_checkpoints

KEYS = {"decoder_only": "init_decoder_from", "encoder_only": "init_encoder_from"}


# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("language-model-starts")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=300)


def run_of(workdir, tokenizer, architecture):
    """A workdir with one checkpoint (step 1) of a tiny model of `architecture` (zero parameters of
    its shapes, found without compiling its initialisation)."""
    model_config = preset("tiny", architecture=architecture, vocab_size=tokenizer.vocab_size)
    tokens = jnp.ones((1, 4), jnp.int32)
    inputs = (tokens, tokens) if architecture == "encoder_decoder" else (tokens,)
    shapes = nn.meta.unbox(jax.eval_shape(build_model(model_config).init, jax.random.key(0), *inputs))
    params = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes["params"])
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.model.architecture = architecture
    save_checkpoints(workdir, config, model_config, tokenizer, {1: params})
    return workdir


def training_section(**keys):
    training = experiment.default_config().training
    for key, value in keys.items():
        training[key] = value
    return training


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_only"])
@pytest.mark.parametrize("checkpoint", ["best", "final"])
def test_a_start_from_a_language_models_best_or_final_names_what_to_choose(
    tokenizer, tmp_path, architecture, checkpoint
):
    """It said `best/ keeps the parameters with the best validation BLEU, which training scores with
    training.bleu_every_steps > 0`, and for final/ `run again with training.final_choice=True`: both
    refused by a language model's training."""
    workdir = run_of(tmp_path / "lm", tokenizer, architecture)
    key = KEYS[architecture]
    for start in (key, "init_from"):
        training = training_section(**{start: str(workdir), "init_checkpoint": checkpoint})
        with pytest.raises(CheckpointError) as refused:
            load_starting_points(training)
        message = str(refused.value)
        assert message.startswith(f"training.{start} (training.init_checkpoint={checkpoint!r}): "), message
        assert f"no {checkpoint!r} checkpoint in {workdir}: {checkpoint}/ holds " in message, message
        assert message.endswith(
            "which a language model's run, translating nothing, never has; choose latest, averaged or a step number"
        ), message
        assert "bleu_every_steps" not in message and "final_choice=True" not in message, message
        assert "\n" not in message


def test_a_translators_missing_best_or_final_keeps_its_advice(tokenizer, tmp_path):
    """A translator's run lacks best/ until it scores validation BLEU, and final/ until it makes its
    final choice: that advice stays."""
    workdir = run_of(tmp_path / "translator", tokenizer, "encoder_decoder")
    with pytest.raises(CheckpointError, match=r"training\.bleu_every_steps > 0"):
        load_starting_points(training_section(init_from=str(workdir), init_checkpoint="best"))
    with pytest.raises(CheckpointError, match=r"training\.final_choice=True"):
        load_starting_points(training_section(init_from=str(workdir), init_checkpoint="final"))


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_only"])
@pytest.mark.parametrize("checkpoint", ["best", "final"])
def test_translating_commands_refuse_a_language_models_run_for_its_model_not_its_missing_checkpoint(
    tokenizer, tmp_path, capsys, architecture, checkpoint
):
    """translate and evaluate --checkpoint best or final on a language model's run named the missing
    folder with the translator's advice (training.bleu_every_steps > 0, final_choice=True), which
    that run's training refuses; export said so of final/: the model is what they refuse."""
    workdir = run_of(tmp_path / "lm", tokenizer, architecture)
    (tmp_path / "in.txt").write_text("A man.\n", encoding="utf-8")
    commands = {
        translate_command: ["--input", str(tmp_path / "in.txt")],
        evaluate_command: ["--split", "validation"],
        export_command: ["--output", str(tmp_path / "export")],
    }
    for command, flags in commands.items():
        assert command.main(["--workdir", str(workdir), "--checkpoint", checkpoint, *flags]) == 2
        refusal = capsys.readouterr().err
        assert refusal.startswith(
            f"error: {workdir} holds {'an' if architecture[0] == 'e' else 'a'} {architecture} "
        ), (
            command.__name__,
            refusal,
        )
        assert refusal.count("\n") == 1 and "needs an encoder_decoder one" in refusal, refusal
    assert not (tmp_path / "export").exists()


def fine_tuned_from_a_run_of(tokenizer, tmp_path, architecture):
    """(config, starting points) of a tiny `architecture` run started (training.init_from) from
    another one's checkpoint, made here."""
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.model.architecture = architecture
    config.training.init_from = str(run_of(tmp_path / "lm", tokenizer, architecture))
    return config, load_starting_points(config.training)


@pytest.mark.parametrize(
    ("architecture", "unread", "read"),
    [("decoder_only", "source_language", "target_language"), ("encoder_only", "target_language", "source_language")],
)
def test_a_language_models_start_is_compared_on_the_one_language_it_reads(
    tokenizer, tmp_path, caplog, architecture, unread, read
):
    """A causal LM fine-tuned from a causal LM with another data.source_language, which neither
    reads, was warned "read source_language='en', and this run reads 'fr': its model starts from
    another language" (a masked LM so of target_language)."""
    config, points = fine_tuned_from_a_run_of(tokenizer, tmp_path, architecture)
    config.data[unread] = "fr"
    caplog.clear()
    check_starting_points(points, config)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    config.data[read] = "fr"
    check_starting_points(points, config)
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert f"read {read}='{'en' if read == 'source_language' else 'de'}', and this run reads 'fr'" in warning


@pytest.mark.parametrize(
    ("architecture", "unread", "built"),
    [("decoder_only", "encoder", "decoder"), ("encoder_only", "decoder", "encoder")],
)
def test_a_language_models_start_is_not_held_to_the_depth_of_a_stack_neither_builds(
    tokenizer, tmp_path, architecture, unread, built
):
    """A causal LM fine-tuned from a causal LM whose model.num_encoder_layers differs (a depth its
    start names unused, and a resume may now change) was refused: "was trained with another model
    section; set it as in that run: model.num_encoder_layers=2 there, 6 here"."""
    config, points = fine_tuned_from_a_run_of(tokenizer, tmp_path, architecture)
    config.model[f"num_{unread}_layers"] = 6
    check_starting_points(points, config)
    config.model[f"num_{built}_layers"] = 6
    with pytest.raises(ConfigError, match=rf"set it as in that run: model\.num_{built}_layers=2 there, 6 here$"):
        check_starting_points(points, config)
