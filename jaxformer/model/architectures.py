"""The three models built from the same blocks, chosen by `TransformerConfig.architecture`."""

from __future__ import annotations

import flax.linen as nn

from jaxformer.model.config import TransformerConfig
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.model.encoder_only import EncoderOnly
from jaxformer.model.transformer import Transformer

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "encoder_decoder": Transformer,
    "encoder_only": EncoderOnly,
    "decoder_only": DecoderOnly,
}


def build_model(config: TransformerConfig) -> nn.Module:
    """The (unbound) flax module of `config.architecture`."""
    return MODEL_CLASSES[config.architecture](config)
