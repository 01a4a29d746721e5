"""A causal language model (decoder-only) on the German side of Multi30k: the multi30k config's
decoder without cross-attention, about 15 minutes on 2 CPU cores. Its checkpoint can start a
translator's decoder (training.init_decoder_from)."""

from jaxformer.configs import multi30k
from jaxformer.training.experiment import default_config


def get_config():
    config = default_config()
    # The model: the multi30k translator's model section, whole (width, heads, feed-forward, depth,
    # dropout, matmul dtype), so that this run's decoder and embedding fit that translator's with no
    # flag to keep in step; its output layer is tied to the embedding.
    config.model = multi30k.get_config().model
    # num_encoder_layers stays, unused here: multi30k_mlm's depth (set apart from num_decoder_layers,
    # the run names it in its `W unused:` line).
    config.model.architecture = "decoder_only"
    config.model.share_embeddings = True  # one language, one embedding (the output layer's too)
    config.data.name = "multi30k"  # the vendored corpus: no download
    config.data.source_language = "en"  # unused: a causal LM reads the target side
    config.data.target_language = "de"  # the text it models (the side a decoder produces)
    config.data.max_length = 64  # tokens per sentence (EOS included) and packed row length
    config.data.batch_size = 32  # packed rows: about 2,000 tokens per batch
    config.data.eval_batch_size = 32
    config.tokenizer.vocab_size = 6000  # a German-only unigram vocabulary, the translator's target size
    config.optimizer.warmup_steps = 400
    config.optimizer.learning_rate_scale = 1.0  # peak lr 160^-0.5 * 400^-0.5 = 4.0e-3 at step 400
    config.training.num_train_steps = 2000  # about 15 minutes on 2 CPU cores
    config.training.label_smoothing = 0.0  # perplexity is the figure that matters here
    config.training.log_every_steps = 50
    config.training.eval_every_steps = 250  # validation loss and perplexity
    config.training.checkpoint_every_steps = 250
    config.training.keep_checkpoints = 3
    config.training.bleu_every_steps = 0  # no translation to score
    return config
