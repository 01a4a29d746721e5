"""The paper's base model (Vaswani et al., 2017, Table 3): 65M parameters, WMT14 English->German.

Needs internet once: tfds downloads and prepares wmt14_translate/de-en (4.5M pairs) into
data.data_dir. Run on accelerators; see README for launch recipes.
"""

from jaxformer.training.experiment import default_config, model_section


def get_config():
    config = default_config()
    # The model: the paper's "base" preset (post-norm, shared and tied embeddings).
    config.model = model_section("base")
    config.model.dropout_rate = 0.1  # P_drop
    config.data.name = "wmt14_translate/de-en"  # tfds builder (newstest2014 is its test split)
    config.data.source_language = "en"
    config.data.target_language = "de"
    config.data.max_length = 256  # tokens per side; longer pairs are dropped; packed row length
    config.data.batch_size = 112  # 112 x 256 slots, about 25,000 target tokens once packed
    config.data.eval_batch_size = 64
    config.tokenizer.vocab_size = 37_000  # the paper's shared source-target vocabulary size
    config.tokenizer.model_type = "bpe"  # byte-pair encoding, as in the paper
    config.tokenizer.max_sentences = 4_000_000  # sentences sampled to train the tokenizer
    config.optimizer.warmup_steps = 4000  # the paper's warmup
    config.optimizer.learning_rate_scale = 1.0  # the paper's schedule, unscaled
    config.training.num_train_steps = 100_000  # the paper: 100k steps (base), 300k (big)
    config.training.label_smoothing = 0.1  # epsilon_ls
    config.training.log_every_steps = 100
    config.training.eval_every_steps = 5000
    config.training.checkpoint_every_steps = 5000
    config.training.keep_checkpoints = 5  # the paper averages the last 5 (base) or 20 (big) checkpoints
    return config
