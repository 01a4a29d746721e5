"""The paper's big model (Vaswani et al., 2017, Table 3): 213M parameters, WMT14 English->German.

The base setup (configs/wmt14_base.py) with the big model, its dropout and a longer run.
"""

import importlib.util
import pathlib

from jaxformer.training.experiment import model_section


def _base_config():
    path = pathlib.Path(__file__).with_name("wmt14_base.py")
    spec = importlib.util.spec_from_file_location("wmt14_base", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config():
    config = _base_config()
    # The model: the paper's "big" preset (d_model 1024, 16 heads, d_ff 4096).
    config.model = model_section("big")
    config.model.dropout_rate = 0.3  # P_drop for the big en-de model
    config.training.num_train_steps = 300_000  # the paper: 300k steps for big
    config.training.keep_checkpoints = 20  # the paper averages the last 20 checkpoints for big
    return config
