"""The paper's big model (Vaswani et al., 2017, Table 3): 213M parameters, WMT14 English->German.

The base setup (jaxformer/configs/wmt14_base.py) with the big model, its dropout and a longer run.
"""

from jaxformer.configs import wmt14_base
from jaxformer.training.experiment import model_section


def get_config():
    config = wmt14_base.get_config()
    # The model: the paper's "big" preset (d_model 1024, 16 heads, d_ff 4096).
    config.model = model_section("big")
    config.model.dropout_rate = 0.3  # P_drop for the big en-de model
    config.training.num_train_steps = 300_000  # the paper: 300k steps for big
    config.training.keep_checkpoints = 20  # the paper averages the last 20 checkpoints for big
    return config
