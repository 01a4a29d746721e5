"""README's Fine-tuning recipe for your own data, checked against the shipped configs: a run of
one config starts only a run of the same model section, so a `multi30k` run is fine-tuned on your
files with `--config multi30k --config.data.name=parallel_files`, and `--config parallel_files`
from it is refused with the keys README names."""

import pathlib
import re
import types

import pytest

from jaxformer.model.config import ConfigError
from jaxformer.training import experiment
from jaxformer.training.config_file import apply_overrides, load_config
from jaxformer.training.init_from import StartingPoint

README = pathlib.Path(__file__).parents[2] / "README.md"


def run_of(name: str) -> StartingPoint:
    """A checkpoint of a run of the shipped config `name`, as check_starting_points reads it."""
    config = load_config(name)
    separate = config.tokenizer.separate_vocabularies
    model = experiment.model_config(config, 1000, 1000 if separate else None)
    metadata = types.SimpleNamespace(
        model=model.to_dict(), target_tokenizer=object() if separate else None, config=config.to_dict()
    )
    return StartingPoint(where=f"a {name} run", step=1, metadata=metadata, params=None)


def fine_tuning(name: str, *overrides: tuple[str, str]):
    config = load_config(name)
    apply_overrides(config, [("data.name", "parallel_files"), ("data.files.train", "corpus/train.{lang}"), *overrides])
    return config


def test_a_multi30k_run_is_fine_tuned_on_own_files_with_its_own_config():
    from jaxformer.training.init_from import check_starting_points

    check_starting_points([run_of("multi30k")], fine_tuning("multi30k"))
    check_starting_points([run_of("parallel_files")], fine_tuning("parallel_files"))


def test_parallel_files_from_a_multi30k_run_names_the_keys_readme_names():
    from jaxformer.training.init_from import check_starting_points

    with pytest.raises(ConfigError) as raised:
        check_starting_points([run_of("multi30k")], fine_tuning("parallel_files"))
    named = re.findall(r"(\S+)=(\S+) there", str(raised.value))
    assert named == [
        ("model.d_model", "160"),
        ("model.d_ff", "640"),
        ("model.share_embeddings", "False"),
        ("tokenizer.separate_vocabularies", "True"),
    ]
    fine_tuning_section = README.read_text().split("## Fine-tuning")[1].split("\n## ")[0]
    text = " ".join(fine_tuning_section.split())  # README's lines wrapped anywhere
    for key, value in named:
        assert f"`{key}={value}`" in text, key
    assert "`--config multi30k --config.data.name=parallel_files --config.data.files.train=..." in text
