"""A tiny model that builds and runs in seconds on a CPU; used by the tests."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The model: a named preset plus field overrides (see jaxformer/model/config.py for every field).
    config.model = ml_collections.ConfigDict()
    config.model.preset = "tiny"  # starting point: tiny, base or big
    config.model.vocab_size = 64  # joint source/target vocabulary, the 4 special tokens included
    config.model.d_model = 32  # residual stream width
    config.model.num_heads = 4  # attention heads; must divide d_model
    config.model.d_ff = 64  # feed-forward inner width
    config.model.num_encoder_layers = 2  # encoder depth
    config.model.num_decoder_layers = 2  # decoder depth
    config.model.dropout_rate = 0.1  # residual and embedding dropout
    return config
