"""The paper's big model (Vaswani et al., 2017, Table 3): 213M parameters, WMT14 en-de."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The model: a named preset plus field overrides (see jaxformer/model/config.py for every field).
    config.model = ml_collections.ConfigDict()
    config.model.preset = "big"  # starting point: tiny, base or big
    config.model.vocab_size = 37_000  # shared byte-pair vocabulary of the paper's en-de setup
    config.model.normalization = "post"  # post-norm, as in the paper ("pre" for pre-norm)
    config.model.dropout_rate = 0.3  # P_drop for the big en-de model
    config.model.share_embeddings = True  # one embedding matrix for source and target
    config.model.tie_output_embedding = True  # output softmax weights = embedding matrix
    config.model.dtype = "float32"  # compute dtype ("bfloat16" on GPU/TPU)
    return config
