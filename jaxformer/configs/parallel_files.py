"""Your own parallel text (data.name "parallel_files"): a small model for tens of thousands of pairs.

Set the files and the language pair on the command line, e.g.

    jaxformer-train --config parallel_files --workdir runs/fr-ja \
        --config.data.source_language=fr --config.data.target_language=ja \
        --config.data.files.train='corpus/train.{lang}.gz' --config.data.files.test=corpus/test.tsv

A file spec is a TSV file (*.tsv, *.tsv.gz: source<TAB>target per line) or a path with {lang} in
it, filled in with each language code (line-aligned text files, .gz allowed). Without
data.files.validation, data.validation_holdout training pairs (seeded) become the validation split.
"""

from jaxformer.training.experiment import default_config, model_section


def get_config():
    config = default_config()
    # The model: base-like post-norm Transformer, narrowed for 10,000-100,000 training pairs.
    config.model = model_section(
        "base",
        d_model=256,  # residual width
        num_heads=4,  # head size 64, as in the paper
        d_ff=1024,  # 4 x d_model, as in the paper
        num_encoder_layers=3,  # shallow: deeper stacks overfit a small corpus
        num_decoder_layers=3,  # as many as the encoder
        dropout_rate=0.2,  # P_drop, above the paper's 0.1: regularises a small corpus
    )
    config.data.name = "parallel_files"  # the files in data.files
    config.data.source_language = "en"  # placeholder: your source language code ("fr", "ja", "pt_BR", ...)
    config.data.target_language = "fr"  # placeholder: your target language code
    config.data.files.train = "corpus/train.{lang}.gz"  # placeholder: a TSV file or a {lang} path, relative to the cwd
    config.data.files.validation = None  # None: data.validation_holdout pairs held out of train
    config.data.files.test = None  # None: no test split; set it to score one with evaluate.py --split test
    config.data.validation_holdout = 1000  # training pairs held out (seeded by data.shuffle_seed) without a file
    config.data.shuffle_seed = 0  # seeds the holdout, the per-epoch shuffle and the packing
    config.data.max_length = 128  # tokens per side, EOS included; longer pairs are dropped; also the row length
    config.data.batch_size = 32  # packed rows: up to 4,096 target tokens per batch
    config.data.eval_batch_size = 32  # packed rows per evaluation batch
    config.tokenizer.vocab_size = 8000  # pieces per vocabulary
    config.tokenizer.separate_vocabularies = False  # one joint vocabulary; True: one per language (unrelated scripts)
    config.tokenizer.model_type = "unigram"  # sentencepiece unigram LM pieces ("bpe" also works)
    config.tokenizer.character_coverage = 1.0  # every character; 0.9995 maps the rarest CJK characters to <unk>
    config.optimizer.warmup_steps = 800  # short warmup for a short run
    config.optimizer.learning_rate_scale = 1.0  # peak lr 256^-0.5 * 800^-0.5 = 2.2e-3 at step 800
    config.training.num_train_steps = 6000  # about 30 epochs of 30,000 pairs (some 150 pairs per batch)
    config.training.label_smoothing = 0.1  # epsilon_ls
    config.training.log_every_steps = 50  # training metrics to TensorBoard / metrics.jsonl
    config.training.eval_every_steps = 500  # validation loss and perplexity
    config.training.checkpoint_every_steps = 500  # resumable every 500 steps
    config.training.keep_checkpoints = 5  # the last five, for checkpoint averaging
    config.training.bleu_every_steps = 1000  # beam-4 BLEU on validation; best parameters kept in workdir/best
    config.training.bleu_examples = 500  # validation pairs translated for that BLEU
    return config
