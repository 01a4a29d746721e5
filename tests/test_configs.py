"""Every experiment config file builds a valid model config."""

import importlib.util
import pathlib

import pytest

from jaxformer.model.config import ConfigError, TransformerConfig, preset

CONFIG_DIR = pathlib.Path(__file__).parents[1] / "configs"


def load(name):
    spec = importlib.util.spec_from_file_location(name, CONFIG_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("name,preset_name", [("tiny", "tiny"), ("wmt14_base", "base"), ("wmt14_big", "big")])
def test_config_files_build_their_preset(name, preset_name):
    config = load(name)
    assert TransformerConfig.from_dict(config.model.to_dict()) == preset(preset_name)


def test_every_config_file_is_covered():
    assert {path.stem for path in CONFIG_DIR.glob("*.py")} == {"tiny", "wmt14_base", "wmt14_big"}


def test_overrides_apply_and_typos_are_caught():
    config = load("wmt14_base")
    config.model.num_encoder_layers = 4
    assert TransformerConfig.from_dict(config.model.to_dict()).num_encoder_layers == 4
    config.model.num_encoder_layer = 4
    with pytest.raises(ConfigError, match="did you mean num_encoder_layers"):
        TransformerConfig.from_dict(config.model.to_dict())
