"""A tiny model on a slice of Multi30k: runs in seconds on a CPU; used by the tests."""

from jaxformer.training.experiment import default_config, model_section


def get_config():
    config = default_config()
    # The model: the tiny preset (d_model 32, 4 heads, d_ff 64, 2 + 2 layers); vocab from the tokenizer.
    config.model = model_section("tiny")
    config.data.max_length = 48  # tokens per side and packed row length
    config.data.batch_size = 4  # packed rows per batch
    config.data.eval_batch_size = 8  # packed rows per evaluation batch
    config.data.max_eval_examples = 64  # a slice of the validation split keeps evaluation quick
    config.data.num_threads = 0  # read in the main thread
    # Read and encode only the pairs the short run draws, not all 29,000 up front: the same
    # batches (tests/data/test_pipeline.py), a few seconds less for each of the tests' runs.
    config.data.encode_once_max_examples = 0
    config.tokenizer.vocab_size = 1000  # small joint vocabulary
    config.tokenizer.max_sentences = 4000  # sentences sampled to train the tokenizer
    config.optimizer.warmup_steps = 50  # short warmup for short runs
    config.optimizer.learning_rate_scale = 2.0  # peak lr 2 * 32^-0.5 * 50^-0.5 = 0.05
    config.training.num_train_steps = 40  # a few seconds
    config.training.log_every_steps = 1  # every step's loss in metrics.jsonl
    config.training.eval_every_steps = 20  # validation twice
    config.training.checkpoint_every_steps = 20  # checkpoints at steps 20 and 40
    config.training.keep_checkpoints = 3  # keep them all
    return config
