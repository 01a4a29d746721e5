"""A masked LM's validation whose masking selects no token is refused (it would score a loss of 0)
with a remedy that works: raising data.max_eval_examples where it cuts the split, and giving the
split more text where every example of it is evaluated already, which no limit can add to."""

import jax.numpy as jnp
import pytest

from jaxformer.data.parallel_text import DataError
from jaxformer.training import experiment
from jaxformer.training.config_file import apply_overrides, split_overrides
from jaxformer.training.loop import train_and_evaluate
from jaxformer.training.objectives import MaskedLanguageModel
from tests.data.test_monolingual_files import english, write_lines
from tests.training.test_language_model_own_files import SHORT_RUN
from tests.training.test_language_models import TINY


def masks_nothing(monkeypatch):
    """Every masking selects no token, as a short split's can."""
    drawn = MaskedLanguageModel.masked

    def nothing_selected(self, rng, tokens):
        masked = drawn(self, rng, tokens)
        return masked._replace(weights=jnp.zeros_like(masked.weights))

    monkeypatch.setattr(MaskedLanguageModel, "masked", nothing_selected)


def masked_lm_config(tmp_path, validation_texts, max_eval_examples):
    write_lines(tmp_path / "english.txt", [english(i) for i in range(200)])
    write_lines(tmp_path / "dev.txt", [english(i) for i in range(200, 200 + validation_texts)])
    config = experiment.default_config()
    config.model.architecture = "encoder_only"
    tiny, _ = split_overrides(TINY)
    apply_overrides(
        config,
        [
            ("data.name", "parallel_files"),
            ("data.files.train", str(tmp_path / "english.txt")),
            ("data.files.validation", str(tmp_path / "dev.txt")),
            ("data.data_dir", str(tmp_path / "tfds")),
            *tiny,
            *SHORT_RUN,
            ("data.validation_holdout", "1000"),  # SHORT_RUN's 20: unused beside a validation file
            ("data.max_eval_examples", max_eval_examples),
        ],
    )
    return config


@pytest.mark.parametrize(
    ("validation_texts", "max_eval_examples", "remedy"),
    [
        (3, "64", r"the validation split holds no more \(3, all evaluated\): give it more text"),
        (3, "None", r"the validation split holds no more \(3, all evaluated\): give it more text"),
        (10, "2", r"evaluate more of them \(data\.max_eval_examples=2 of the split's 10\)"),
    ],
)
def test_a_validation_masked_nowhere_names_a_remedy_that_works(
    tmp_path, monkeypatch, validation_texts, max_eval_examples, remedy
):
    """It said "evaluate more of them (data.max_eval_examples)" of a 3-text split read whole under
    data.max_eval_examples=64: raising it evaluates nothing more."""
    masks_nothing(monkeypatch)
    config = masked_lm_config(tmp_path, validation_texts, max_eval_examples)
    count = min(validation_texts, int(max_eval_examples)) if max_eval_examples != "None" else validation_texts
    with pytest.raises(
        DataError,
        match=rf"^evaluation: the masking \(seed 0\) selects none of the \d+ tokens of the "
        rf"{count} validation examples; {remedy}$",
    ):
        train_and_evaluate(config, str(tmp_path / "run"))
