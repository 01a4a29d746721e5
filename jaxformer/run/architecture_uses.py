"""What a run of each architecture is for, said where a use that needs another refuses its model."""

from __future__ import annotations

from jaxformer.errors import with_article
from jaxformer.model.config import ConfigError, TransformerConfig

ARCHITECTURE_USES = {
    "encoder_decoder": "translate with it through jaxformer-translate / Translator",
    "decoder_only": "continue text with it through jaxformer-generate / LanguageModel",
    "encoder_only": "a masked LM translates and continues nothing: "
    "start a translator's encoder from it with training.init_encoder_from",
}


def refuse_another_model(config: TransformerConfig, architecture: str, user: str) -> None:
    """ConfigError where `config`'s model is not of `architecture`, which `user` (a class, e.g.
    "Translator") needs, saying what the model it got is for."""
    if config.architecture != architecture:
        raise ConfigError(
            f"{with_article(user)} needs {with_article(architecture)} model, not {config.architecture!r} "
            f"({ARCHITECTURE_USES.get(config.architecture, '')})"
        )
