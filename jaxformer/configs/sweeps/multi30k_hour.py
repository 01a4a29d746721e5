"""What to change in `multi30k` for the best validation BLEU from one hour on 2 CPU cores.

    jaxformer-sweep --config multi30k --sweep multi30k_hour --workdir runs/sweep_hour

Each variant but `transformer_tiny` (a published recipe, taken whole) changes one thing in the
config (its 55-minute training budget, budget schedule and final choice included), so each row of
the table reads against `baseline`: 38 variants and the baseline, 39 runs, about 39 hours on 2
cores in all, about an hour per variant. What the final choice decodes with (beam size, length
penalty) and how many checkpoints it averages need no training: compare them on the winner with
`jaxformer-evaluate --split validation --checkpoint averaged|best|final --beam_size K --alpha A`.
"""


def get_sweep():
    return {
        "baseline": [],
        # Width and depth: a smaller model takes more steps in the hour.
        "d256": ["model.d_model=256", "model.num_heads=4", "model.d_ff=1024"],  # the default until 2026-11-25
        "d192": ["model.d_model=192", "model.num_heads=4", "model.d_ff=768"],  # the default until 2026-11-27
        # 128 trailed 160 by 0.09 NLL at equal steps and ran 1.09x its steps (docs/multi30k_runs.md).
        "d128": ["model.d_model=128", "model.num_heads=4", "model.d_ff=512"],
        "layers2": ["model.num_encoder_layers=2", "model.num_decoder_layers=2"],
        "layers4": ["model.num_encoder_layers=4", "model.num_decoder_layers=4"],
        "dff512": ["model.d_ff=512"],
        # 2 x d_model, as Transformer-Tiny: 1.185x the step speed, and at seed 1 of a slower VM's hour
        # 0.026 lower in validation NLL at the end but within a seed in the final choice (42.41 against
        # 42.34; docs/multi30k_runs.md, 2026-11-29, afternoon).
        "dff320": ["model.d_ff=320"],
        # The feed-forward's non-linearity: GELU (exact erf form) for the paper's ReLU. At seed 1 of a
        # slower VM's hour it was ahead in validation NLL at every evaluation (by 0.07 at step 500 and
        # 0.02 at the end, 1.490 against 1.511) but ended within a seed in the final choice (42.45
        # against 42.34), at ReLU's pace within the noise (docs/multi30k_runs.md, 2026-11-29, late morning).
        "gelu": ["model.activation=gelu"],
        # Squared ReLU (Primer's): behind GELU and ReLU at seed 1 of the same VM although its faster
        # hour bought 1.07x the steps (final choice 41.86 against 42.34; docs/multi30k_runs.md, 2026-11-29,
        # late morning).
        "squared_relu": ["model.activation=squared_relu"],
        # fairseq's Transformer-Tiny as Wu et al. (2021) trained it to convergence on Multi30k
        # (41.02 tokenized BLEU on test_2016_flickr): 4 + 4 layers of width 128, dropout 0.3,
        # peak rate about 4e-3. About two thirds of the FLOPs a token of `baseline` (d_model 160).
        "transformer_tiny": [
            "model.d_model=128",
            "model.num_heads=4",
            "model.d_ff=256",
            "model.num_encoder_layers=4",
            "model.num_decoder_layers=4",
            "model.dropout_rate=0.3",
            "optimizer.warmup_steps=1000",
            "optimizer.learning_rate_scale=1.5",
        ],
        # Regularisation: 29,000 pairs overfit a 3.4M-parameter model within the hour (multi30k: 0.15,
        # which beat 0.2 at an even pace at two seeds of a slower VM's hour; docs/multi30k_runs.md).
        # 0.1 led 0.15 to step 3,000 of a slower VM's hour and ended behind (NLL 1.477 against 1.455).
        "dropout0.1": ["model.dropout_rate=0.1"],
        "dropout0.2": ["model.dropout_rate=0.2"],  # the default until 2026-11-27
        # 0.3 trailed 0.2 by 4 BLEU at step 3,500 of a fast VM's hour (docs/multi30k_runs.md: "Three more changes").
        "dropout0.3": ["model.dropout_rate=0.3"],
        # fairseq's other two dropouts: on the attention weights and on the feed-forward's hidden layer.
        "attention_dropout0.1": ["model.attention_dropout_rate=0.1", "model.activation_dropout_rate=0.1"],
        # Word dropout (Sennrich and Zhang 2019's low-resource recipe; Marian's --dropout-src/--dropout-trg):
        # whole source and target-input token embeddings dropped.
        "word_dropout0.1": ["model.source_word_dropout_rate=0.1", "model.target_word_dropout_rate=0.1"],
        # 0.2: final choice 42.85 against 0.1's 42.57 at seed 0 of a slower VM's hour, 41.85 against 42.06
        # at seed 1: a tie over two seeds, so multi30k keeps 0.1 (docs/multi30k_runs.md, 2026-11-27, night).
        "smoothing0.2": ["training.label_smoothing=0.2"],
        # 0.0 with weight decay 0.3: final choice 43.51 against 0.1's 43.27 at 0.92x the steps, seed 0 of a
        # slower VM's hour, under the +0.3 a seed-1 pair needed; at a step budget of 4,360, 42.70 against
        # 0.1's 43.27 at the same budget (docs/multi30k_runs.md, 2026-12-03).
        "smoothing0.0": ["training.label_smoothing=0.0"],
        # Decoupled weight decay (AdamW) on the kernels and embeddings (multi30k: 0.3, which beat 0.1 at
        # two seeds of a slower VM's hour, 43.27 and 43.29 against 42.56 and 43.05, as 0.1 had beaten
        # none, 42.50 and 42.01; docs/multi30k_runs.md).
        "no_weight_decay": ["optimizer.weight_decay=0.0"],
        "weight_decay0.1": ["optimizer.weight_decay=0.1"],  # the default until 2026-12-02, early morning
        "weight_decay1.0": ["optimizer.weight_decay=1.0"],
        # The learning rate: its peak and the warmup that reaches it.
        "lr1.5": ["optimizer.learning_rate_scale=1.5"],
        # 0.7 trailed the default at every evaluation of a slower VM's hour at width 160 (NLL 1.490
        # against 1.455; docs/multi30k_runs.md, 2026-11-27, late).
        "lr0.7": ["optimizer.learning_rate_scale=0.7"],
        "warmup400": ["optimizer.warmup_steps=400"],
        # Warmup 400 at the default's peak: ahead in NLL to step 3,000, behind from 4,000 of a slower VM's hour
        # (final choice 42.36 against 42.57; docs/multi30k_runs.md, 2026-11-28, early).
        "warmup400_same_peak": ["optimizer.warmup_steps=400", "optimizer.learning_rate_scale=0.7071"],
        "warmup1600": ["optimizer.warmup_steps=1600"],
        # Tokens per batch: about 2,000 target tokens at 32 packed rows of 64.
        # 24: level at equal rows to 96,000, but 0.93x the rows in the hour (final choice 42.03 against 42.57;
        # docs/multi30k_runs.md, 2026-11-28, early).
        "batch24": ["data.batch_size=24"],
        # 48: 1.02x the rows in the hour, behind at equal rows all of a slower VM's hour (final choice 42.10
        # against 42.57; docs/multi30k_runs.md, 2026-11-27, night).
        "batch48": ["data.batch_size=48"],
        # Vocabulary: pieces per language (multi30k: 6,000; English holds at most 7,931), and one joint
        # vocabulary with shared embeddings (until 2026-11-28 multi30k's, with 8,000 pieces: behind at two
        # seeds of a slow VM's hour, 38.34 and 37.56 against 38.81 and 39.95; docs/multi30k_runs.md).
        # A joint 4,000: 1.11x the steps a second, behind at equal time on a fast VM (docs/multi30k_runs.md,
        # as above).
        "vocab4000": ["tokenizer.vocab_size=4000"],
        "vocab7500": ["tokenizer.vocab_size=7500"],
        "joint_vocabulary": [
            "tokenizer.separate_vocabularies=False",
            "model.share_embeddings=True",
            "tokenizer.vocab_size=8000",
        ],
        "bpe": ["tokenizer.model_type=bpe"],
        # Subword regularisation (Kudo 2018): training segmentations drawn from the 16 best.
        "subword_sampling": ["tokenizer.sampling_nbest=16", "tokenizer.sampling_alpha=0.2"],
        # R-Drop (Liang et al. 2021; multi30k: alpha 2, below the paper's 5 for small corpora): each
        # step runs its batch twice, so half the steps of the hour, each regularised by the copies'
        # agreement. Without it, at other weights, and only after the first 40% of the run.
        "no_rdrop": ["training.rdrop_alpha=0.0"],
        "rdrop1": ["training.rdrop_alpha=1.0"],
        "rdrop3": ["training.rdrop_alpha=3.0"],
        "rdrop5": ["training.rdrop_alpha=5.0"],
        "rdrop10": ["training.rdrop_alpha=10.0"],
        "rdrop_start0.4": ["training.rdrop_start=0.4"],
    }
