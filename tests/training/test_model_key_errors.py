"""A bad model value in an experiment config names the config's key (model.X), where the
library's own TransformerConfig and preset() name the dataclass field."""

import pickle

import pytest

from jaxformer.model.config import ConfigError, FieldError, preset
from jaxformer.training import experiment
from tests.training.test_experiment import load


def test_a_bad_model_value_names_the_configs_key_and_the_library_the_dataclass_field():
    """An experiment config's model section is config model.X, as its other keys are; the library's
    own TransformerConfig and preset() go on naming the field (README, Presets)."""
    config = load("tiny")
    config.model.d_model = 30
    with pytest.raises(ConfigError) as error:
        experiment.validate(config)  # train's and sweep's check
    assert str(error.value) == "config model.d_model=30: must be divisible by model.num_heads=4"
    config.model.update(d_model=32, dtype="bfloat16", matmul_dtype="float32")
    with pytest.raises(ConfigError) as error:
        experiment.model_config(config, 1000)  # the run's start: a dtype as the config gives it
    assert str(error.value) == "config model.matmul_dtype='float32': must not be wider than model.dtype=bfloat16"
    with pytest.raises(ConfigError) as error:
        preset("tiny", d_model=30)
    assert str(error.value) == "TransformerConfig.d_model=30: must be divisible by num_heads=4"


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"architecture": "decoder_only", "share_embeddings": False},
            "{}architecture='decoder_only' has one embedding matrix, nothing to share or separate; untie its output "
            "layer with {}tie_output_embedding=False",
        ),
        (
            {"architecture": "decoder_only", "source_word_dropout_rate": 0.1},
            "{}architecture='decoder_only' has no source: use {}target_word_dropout_rate",
        ),
        (
            {"architecture": "encoder_only", "target_word_dropout_rate": 0.1},
            "{}architecture='encoder_only' has no decoder input: use {}source_word_dropout_rate",
        ),
    ],
)
def test_the_other_model_fields_a_problem_names_are_keys_in_a_config_and_fields_in_the_library(values, problem):
    """The experiment config's error named its key model.X and, in the same line, the field it
    points to bare (use target_word_dropout_rate); both are the config's keys now. The library's
    own errors keep the field names (README, Presets), pickled (another process's) alike."""
    config = load("tiny")
    config.model.update(values)
    field, value = [(key, value) for key, value in values.items() if key != "architecture"][0]
    with pytest.raises(ConfigError) as error:
        experiment.validate(config)
    assert str(error.value) == f"config model.{field}={value!r}: " + problem.replace("{}", "model.")
    with pytest.raises(FieldError) as error:
        preset("tiny", **values)
    assert str(error.value) == f"TransformerConfig.{field}={value!r}: " + problem.replace("{}", "")
    carried = pickle.loads(pickle.dumps(error.value))
    assert (str(carried), carried.problem("model.")) == (str(error.value), problem.replace("{}", "model."))


def test_a_vocabulary_mismatch_names_the_model_keys_to_set():
    config = load("tiny")
    with pytest.raises(ConfigError) as error:
        experiment.model_config(config, 1000, 800)  # separate sizes on a shared embedding
    assert str(error.value) == (
        "config model.source_vocab_size=800: differs from model.vocab_size=1000, so source and target cannot share "
        "one embedding matrix: set model.share_embeddings=False"
    )


def test_model_vocab_must_come_from_the_tokenizer():
    config = load("tiny")
    config.model.vocab_size = 123
    with pytest.raises(ConfigError, match="model.vocab_size=123 differs from the tokenizer's 1000"):
        experiment.validate(config)
