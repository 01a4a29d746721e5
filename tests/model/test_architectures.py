"""Each model class takes the configs of its own architecture only; build_model picks the class."""

import pytest

from jaxformer.model.architectures import MODEL_CLASSES, build_model
from jaxformer.model.config import ARCHITECTURES, ConfigError, preset

CONFIG = preset("tiny")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_build_model_builds_the_class_of_the_architecture(architecture):
    model = build_model(CONFIG.replace(architecture=architecture))
    assert type(model) is MODEL_CLASSES[architecture] and model.config.architecture == architecture


@pytest.mark.parametrize(
    "class_architecture,config_architecture",
    [(mine, other) for mine in ARCHITECTURES for other in ARCHITECTURES if other != mine],
)
def test_a_model_class_refuses_another_architectures_config_when_constructed(class_architecture, config_architecture):
    model_class = MODEL_CLASSES[class_architecture]
    message = (
        rf"^{model_class.__name__} needs a config with architecture='{class_architecture}', "
        rf"got architecture='{config_architecture}' \(build_model\(config\) builds the model"
    )
    with pytest.raises(ConfigError, match=message):
        model_class(CONFIG.replace(architecture=config_architecture))  # before any init or apply
