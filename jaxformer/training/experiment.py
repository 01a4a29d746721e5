"""The experiment config (an ml_collections.ConfigDict): its defaults, validation, and the
model config derived from it. Config files (jaxformer/configs/) start from `default_config()`."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
from collections.abc import Iterable
from typing import Any

import ml_collections
import numpy as np

from jaxformer.data.tokenizer import Tokenizer, pieces_text
from jaxformer.files import home_expanded
from jaxformer.hardware import resolve_matmul_dtype
from jaxformer.model.config import ConfigError, FieldError, TransformerConfig, preset
from jaxformer.training.checked_keys import model_number_keys, refuse_wrong_kinds
from jaxformer.training.config_rules import VALUE_RULES, check_combinations
from jaxformer.training.given_model_size import GivenModelSizeError, changed_since_the_run
from jaxformer.training.sharding import DEFAULT_RULES
from jaxformer.training.text_sides import architecture, control_symbols

DEFAULT_VOCAB_SIZE = 8000  # tokenizer.vocab_size's default: a given model's size replaces it


def model_section(preset_name: str = "base", **overrides: Any) -> ml_collections.ConfigDict:
    """The `model` section: the preset's name and every TransformerConfig field at the preset's
    value (with `overrides`), so any field can be overridden from the command line; a float field
    refuses a bool as it is set (checked_keys.model_number_keys)."""
    values = preset(preset_name, **overrides).to_dict()
    for field in ("vocab_size", "source_vocab_size", "deterministic"):  # set from the tokenizers / by the loop
        values.pop(field)
    # None by default: typed, so that --config.model.matmul_dtype=bfloat16 (or auto) parses as a string,
    # --config.model.max_positions=512 as an integer.
    values["matmul_dtype"] = ml_collections.FieldReference(values["matmul_dtype"], field_type=str)
    values["max_positions"] = ml_collections.FieldReference(values["max_positions"], field_type=int)
    return ml_collections.ConfigDict({"preset": preset_name, **model_number_keys(values)})


def default_config() -> ml_collections.ConfigDict:
    """Every key an experiment config may set, with its default and meaning."""
    config = ml_collections.ConfigDict()

    # The model: every field of jaxformer.model.config.TransformerConfig, starting from a preset;
    # vocab_size comes from the tokenizer.
    config.model = model_section("base")

    config.data = ml_collections.ConfigDict()
    # "multi30k" (vendored, offline), "parallel_files" (your own files, data.files) or a tfds
    # name: "wmt14_translate/de-en", "wmt17_translate/de-en".
    config.data.name = "multi30k"
    config.data.source_language = "en"  # translate from ...
    config.data.target_language = "de"  # ... into
    config.data.data_dir = ml_collections.FieldReference(None, field_type=str)  # tfds's (None: ~/tensorflow_datasets)
    # multi30k only: folder of the raw .gz files (None: the vendored copy)
    config.data.raw_dir = ml_collections.FieldReference(None, field_type=str)
    config.data.download = False  # multi30k only: fetch the official files instead of the vendored copy
    # parallel_files only: per split, a TSV file (source<TAB>target per line, .gz allowed) or a
    # path with "{lang}" in it, filled with each language code for line-aligned text files.
    config.data.files = ml_collections.ConfigDict()
    config.data.files.train = ml_collections.FieldReference(None, field_type=str)  # required
    config.data.files.validation = ml_collections.FieldReference(None, field_type=str)  # None: held out of train
    config.data.files.test = ml_collections.FieldReference(None, field_type=str)  # None: no test split
    config.data.validation_holdout = 1000  # parallel_files without validation file: train pairs held out (seeded)
    config.data.train_split = "train"
    config.data.eval_split = "validation"
    config.data.max_length = 128  # tokens per side, EOS included; longer pairs are dropped; also the packed row length
    config.data.batch_size = 64  # packed rows per (global) batch: up to batch_size * max_length target tokens
    config.data.eval_batch_size = 64  # packed rows per evaluation batch
    config.data.max_eval_examples = ml_collections.FieldReference(None, field_type=int)  # None: the whole eval split
    config.data.shuffle_seed = 0  # seeds the per-epoch shuffle and the packing (0 to 2**32 - 1: grain's)
    config.data.num_threads = 2  # grain reader threads
    # A training shard of at most this many pairs is sentencepiece-encoded once, before training,
    # and kept in memory (4 bytes a token: Multi30k's 29,000 pairs take 3 MB), instead of read and
    # encoded each time an epoch draws it; the batches are the same. 0: always encode as drawn.
    config.data.encode_once_max_examples = 1_000_000
    config.data.input_shards = 0  # slices of each global batch, each read by its own pipeline (0: one per process)

    config.tokenizer = ml_collections.ConfigDict()
    # Pieces of each sentencepiece vocabulary trained here, special tokens included (with every
    # vocabulary given by tokenizer.model_path / target_model_path: the default, or their size).
    config.tokenizer.vocab_size = DEFAULT_VOCAB_SIZE
    # An existing sentencepiece model used instead of training one (its special pieces are moved
    # to jaxformer's ids); with separate vocabularies, the source side's.
    config.tokenizer.model_path = ml_collections.FieldReference(None, field_type=str)
    # One vocabulary per language (untied source and target embeddings), for unrelated scripts.
    config.tokenizer.separate_vocabularies = False
    config.tokenizer.target_model_path = ml_collections.FieldReference(None, field_type=str)  # separate only
    config.tokenizer.model_type = "unigram"  # "unigram" or "bpe"
    config.tokenizer.character_coverage = 1.0  # share of characters the vocabulary must cover
    config.tokenizer.max_sentences = 2_000_000  # sentences sampled from the training split to train it
    # Subword regularisation (Kudo 2018; jaxformer/data/subword_sampling.py): each side of each
    # training pair, each time it is read, is one of its sampling_nbest most likely segmentations,
    # drawn with probability proportional to P(segmentation)^sampling_alpha; evaluation and
    # translation use the best one. 0: off. Unigram models only.
    config.tokenizer.sampling_nbest = 0
    config.tokenizer.sampling_alpha = 0.2  # 0: uniform among the n best; larger: nearer the best one

    config.optimizer = ml_collections.ConfigDict()
    # "rsqrt": the paper's warmup then inverse square root decay; "budget": the same warmup to the
    # same peak, then a linear decay to decay_floor * peak where the run's budget ends
    # (num_train_steps, or training.time_budget_minutes's estimate of the last step).
    config.optimizer.schedule = "rsqrt"
    config.optimizer.learning_rate_scale = 1.0  # lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    config.optimizer.warmup_steps = 4000
    config.optimizer.decay_floor = 0.0  # "budget" schedule: the last rate, as a fraction of the peak
    config.optimizer.b1 = 0.9  # Adam beta1
    config.optimizer.b2 = 0.98  # Adam beta2
    config.optimizer.eps = 1e-9  # Adam epsilon
    # Decoupled weight decay (AdamW): each update also shrinks the kernels and embeddings by
    # learning rate x weight_decay of their value; biases and LayerNorm scales are left alone. 0: Adam.
    config.optimizer.weight_decay = 0.0
    config.optimizer.clip_norm = 1.0  # global gradient-norm clip (0 turns it off)
    # Each batch in this many micro-batches of data.batch_size / k rows (activation memory of one);
    # their gradients are summed, so a step is still one update of the whole batch.
    config.optimizer.accumulation_steps = 1
    # An exponential moving average of the parameters with this decay (0: none), kept in the
    # optimizer state and offered to the final choice as the candidate "ema" (parameter_ema.py).
    config.optimizer.ema_decay = 0.0

    # Devices: a (data, fsdp, tensor) mesh and the rules mapping logical axis names onto it.
    config.mesh = ml_collections.ConfigDict()
    config.mesh.shape = (-1, 1, 1)  # sizes of (data, fsdp, tensor); -1 takes the remaining devices
    config.mesh.logical_axis_rules = DEFAULT_RULES  # (logical name, mesh axes) pairs, tried in order

    config.training = ml_collections.ConfigDict()
    config.training.seed = 0  # parameter initialisation and dropout (0 to 2**31 - 1: a jitted int32)
    # Fine-tuning: start from the parameters (and tokenizer) of another run's workdir or checkpoint
    # directory, with a fresh optimizer, step and data order. None: random initialisation.
    config.training.init_from = ml_collections.FieldReference(None, field_type=str)
    # A translator composed of pretrained halves: its encoder (and source embedding) from an
    # encoder_only (masked-LM) run, its decoder (and target embedding) from a decoder_only (causal
    # LM) run; the cross-attention starts from random values. Instead of init_from.
    config.training.init_encoder_from = ml_collections.FieldReference(None, field_type=str)
    config.training.init_decoder_from = ml_collections.FieldReference(None, field_type=str)
    # With init_from / init_encoder_from / init_decoder_from: "latest", "best", "averaged", "final" or a step.
    config.training.init_checkpoint = "latest"
    config.training.num_train_steps = 100_000
    # A wall-clock budget for the training loop (its steps, evaluations and checkpoints) across
    # resumes; the run ends when it is spent, or at num_train_steps. 0: no time budget.
    config.training.time_budget_minutes = 0.0
    config.training.label_smoothing = 0.1  # epsilon_ls
    # R-Drop (Liang et al., 2021): each example runs twice under different dropout, and the loss
    # adds this weight times the two predictions' symmetric KL divergence (twice a step's compute;
    # the paper's 5 for small translation corpora). 0: off. Not for encoder_only (its masking
    # differs between the copies).
    config.training.rdrop_alpha = 0.0
    # With R-Drop: the fraction of the run (of the time budget or of num_train_steps, whichever is
    # further along) trained with plain steps before R-Drop starts (rdrop_start.py). 0: from the first step.
    config.training.rdrop_start = 0.0
    # With R-Drop and a time budget: R-Drop only where the budget buys at least this many plain
    # steps, as estimated at rdrop_decision_step from the plain steps' pace until then; below it the
    # run stays plain to the end (rdrop_start.py: RDropByPace). 0: R-Drop whatever the pace.
    config.training.rdrop_min_plain_steps = 0
    # The step that decides (the steps before it are plain): late enough that the pace so far
    # includes what the rest of the run pays for (evaluations, validation BLEU, checkpoints).
    config.training.rdrop_decision_step = 600
    # Output projection + loss fused over chunks of this many target tokens (0: the whole batch at once).
    config.training.loss_chunk_tokens = 512
    config.training.log_every_steps = 100  # training metrics to TensorBoard / metrics.jsonl
    config.training.eval_every_steps = 1000  # validation loss and perplexity
    config.training.checkpoint_every_steps = 1000
    config.training.keep_checkpoints = 3  # the newest K checkpoints are kept
    config.training.bleu_every_steps = 0  # validation BLEU (and workdir/best's checkpoint) every N steps; 0: off
    config.training.bleu_examples = 500  # validation pairs translated for that BLEU (0: all)
    # The search for that BLEU, "greedy" or "beam" (None: decoding.method); greedy costs a fraction
    # of beam 4 and ranks checkpoints alike. The final choice always uses `decoding`.
    config.training.bleu_method = ml_collections.FieldReference(None, field_type=str)
    # sacreBLEU's tokenizer for BLEU and lowercase BLEU, here and in evaluate (e.g. "char", "13a",
    # "intl"). None: sacreBLEU's choice for data.target_language, as its `-l src-trg` makes it:
    # "zh", "ja-mecab" (pip install 'jaxformer[ja]'), "ko-mecab" (jaxformer[ko]), else "13a".
    config.training.bleu_tokenize = ml_collections.FieldReference(None, field_type=str)
    # At the end of the run, the latest parameters, best/'s and the mean of the last average_last
    # checkpoints are scored on the whole validation split with `decoding`; the highest is saved
    # to workdir/final ("--checkpoint final").
    config.training.final_choice = False
    config.training.average_last = 5  # checkpoints averaged for that choice (of those kept; < 2: none)
    # Length penalties (decoding.alpha values) the chosen parameters are then translated with; the
    # best on validation is kept with them in final/ and used by translate / evaluate / export
    # unless --alpha is given. (): keep decoding.alpha.
    config.training.final_alphas = ()

    # Translation for validation BLEU (translate.py and evaluate.py take the same settings as flags).
    config.decoding = ml_collections.ConfigDict()
    config.decoding.method = "beam"  # "beam", "greedy" or "sample"
    config.decoding.beam_size = 4  # the paper's beam
    config.decoding.alpha = 0.6  # length penalty ((5 + |Y|) / 6)^alpha
    # Its form: "gnmt", ((5 + |Y|) / 6)^alpha, or "transformers", |Y|^alpha (as a --from_hf import is
    # decoded). None: the form of training.init_from's run (an import's: transformers), else gnmt
    # (run_start.settle_inherited_decoding).
    config.decoding.length_penalty = ml_collections.FieldReference(None, field_type=str)
    # True: each step's log-probabilities normalised over the tokens the search allows there (pad and
    # BOS removed before the softmax), as transformers' generate with renormalize_logits=True scores
    # (a --from_hf import of such a model sets it). None: training.init_from's run's, else False.
    config.decoding.renormalize_after_bans = ml_collections.FieldReference(None, field_type=bool)
    config.decoding.max_extra_length = 50  # output tokens <= source tokens + this (at most 4,096: MAX_EXTRA_LENGTH)
    # When beam search stops a sentence: exact, current_length (the same validation BLEU as exact on
    # Multi30k, a fifth faster) or beam_full.
    config.decoding.stop = "current_length"
    config.decoding.batch_size = 32  # sentences per decoding batch (two decode at once: Translator)
    refuse_wrong_kinds(config)  # a config file's True would be cast to 1.0 unseen, its 1.0 for a tuple unnamed
    return config


def flatten(config, prefix: str = "") -> dict[str, Any]:
    """{"section.key": value} for a nested ConfigDict or dict."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, (dict, ml_collections.ConfigDict)):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def as_tuples(flat: dict[str, Any]) -> dict[str, Any]:
    """Lists (as a checkpoint's JSON holds a config's tuples) as tuples, nested ones too."""

    def convert(value):
        return tuple(convert(item) for item in value) if isinstance(value, (list, tuple)) else value

    return {key: convert(value) for key, value in flat.items()}


@functools.cache
def nullable_keys() -> frozenset[str]:
    """The dotted keys whose default_config() value is None: None is one of their values."""
    return frozenset(key for key, value in flatten(default_config()).items() if value is None)


def unknown_key_error(key: str, known: Iterable[str]) -> ConfigError:
    """The error for a config key nobody defines, naming up to three near matches among the `known`
    dotted keys. Only a key that could stand where `key` stands is named: one that holds a value (a
    typed key sets one, so never a section such as `training` for `training.datas`, `decoding` for
    `model.decoding`) and has as many parts, each section where `key` has a section (`training.seed`
    for `trainig.seed`, `data.files.train` for `data.file.train`, never `data.files` for `data.file`)."""
    known = list(known)
    sections = {".".join(parts[:end]) for parts in (name.split(".") for name in known) for end in range(1, len(parts))}
    depth = key.count(".")
    values = [name for name in known if name not in sections and name.count(".") == depth]
    near = difflib.get_close_matches(key, values, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


@functools.cache
def known_keys() -> frozenset[str]:
    """The dotted keys a config may hold: default_config()'s, and in the model section any
    TransformerConfig field (vocab_size: refused unless the tokenizer's) and the preset's name."""
    return frozenset(
        {
            *flatten(default_config()),
            "model.preset",
            *(f"model.{field.name}" for field in dataclasses.fields(TransformerConfig)),
        }
    )


def validate(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None = None) -> None:
    """Raises ConfigError naming the key and what it allows, for an unknown key (with near
    matches), a value out of range, values that contradict each other, or a bad model."""
    known = known_keys()
    values = flatten(config)
    for key in values:
        if key not in known:
            raise unknown_key_error(key, known)
    for key, (allowed, description) in VALUE_RULES.items():
        if key in values and not allowed(values[key]):
            raise ConfigError(f"config {key}={values[key]!r}: must be {description}")
    check_combinations(config, architecture(config))
    source_size, target_size = vocabulary_sizes(config, workdir)
    model_config(config, target_size, source_size if config.tokenizer.separate_vocabularies else None)


def vocabulary_sizes(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None = None) -> tuple[int, int]:
    """(source, target) vocabulary sizes of the run: tokenizer.vocab_size for a vocabulary trained
    here, the piece count of a given model (tokenizer.model_path / target_model_path) otherwise;
    the same number twice for a shared vocabulary. Reads (and converts) the given models, so a
    missing or unusable file, or a contradicting tokenizer.vocab_size, is an error before any
    data is prepared; in a run's `workdir`, a model changed since the run started is named so."""
    section = config.tokenizer
    if section.target_model_path is not None and architecture(config) != "encoder_decoder":
        raise ConfigError(
            f"config tokenizer.target_model_path={section.target_model_path!r}: a language model "
            f"(model.architecture={architecture(config)!r}) has one vocabulary; give it as tokenizer.model_path"
        )
    if section.target_model_path is not None and not section.separate_vocabularies:
        raise ConfigError(
            f"config tokenizer.target_model_path={section.target_model_path!r} needs "
            "--config.tokenizer.separate_vocabularies=True (a shared vocabulary is tokenizer.model_path)"
        )
    if section.separate_vocabularies and config.model.get("share_embeddings", True):
        raise ConfigError(
            "config tokenizer.separate_vocabularies=True gives source and target their own embedding matrices: "
            "set --config.model.share_embeddings=False"
        )
    paths = {"model_path": section.model_path}
    if section.separate_vocabularies:
        paths["target_model_path"] = section.target_model_path
    # "~" as the run reads them (config_paths): validation comes before the paths are made absolute.
    paths = {key: None if path is None else home_expanded(path) for key, path in paths.items()}
    tokenizers = {
        key: Tokenizer.from_sentencepiece_file(path, control_symbols(config))
        for key, path in paths.items()
        if path is not None
    }
    given = {key: tokenizer.vocab_size for key, tokenizer in tokenizers.items()}
    # A fine-tuning start's tokenizer is the one its side uses (it replaces vocab_size, logged), a
    # given model there only checked against it: vocab_size is held to the other sides' models.
    checked = {key: path for key, path in paths.items() if key not in _given_by_starts(config)}
    sizes = {given[key] for key in checked if key in given}
    # Nothing trained here: vocab_size can only agree with the models, and one number cannot agree
    # with two models of different sizes. Only default_config's value means "the models' sizes"; a
    # config file's own value (tiny's 1000, multi30k's 6000) is a choice like any other.
    accepted = {DEFAULT_VOCAB_SIZE, *sizes} if len(sizes) == 1 else {DEFAULT_VOCAB_SIZE}
    if checked and all(key in given for key in checked) and section.vocab_size not in accepted:
        models = " and ".join(f"tokenizer.{key} {pieces_text(paths[key], tokenizers[key])}" for key in checked)
        choice = f"{DEFAULT_VOCAB_SIZE}" if len(sizes) > 1 else f"{next(iter(sizes))}, or {DEFAULT_VOCAB_SIZE}"
        both = "; one value cannot be both sizes" if len(sizes) > 1 else ""
        error = GivenModelSizeError(
            f"config tokenizer.vocab_size={section.vocab_size}, but {models}, and no vocabulary is trained here: "
            f"set tokenizer.vocab_size={choice} (default_config()'s value, which takes each given model's size{both}; "
            "a config file's own value, such as multi30k's 6000, counts as a choice)",
            {key: given[key] for key in checked},
        )
        raise changed_since_the_run(error, config, workdir)
    source = given.get("model_path", section.vocab_size)
    target = given.get("target_model_path", section.vocab_size) if section.separate_vocabularies else source
    return source, target


def _given_by_starts(config: ml_collections.ConfigDict) -> set[str]:
    """The tokenizer keys ("model_path", "target_model_path") of the vocabularies that a new run's
    fine-tuning start gives with its embeddings (training.init_from: every one; init_encoder_from:
    the source's; init_decoder_from: the target's; a shared one, by any of them)."""
    training = config.training
    source = training.get("init_from") or training.get("init_encoder_from")
    target = training.get("init_from") or training.get("init_decoder_from")
    if not config.tokenizer.separate_vocabularies:
        return {"model_path"} if source or target else set()
    return {key for key, start in (("model_path", source), ("target_model_path", target)) if start}


def model_config(
    config: ml_collections.ConfigDict, vocab_size: int, source_vocab_size: int | None = None
) -> TransformerConfig:
    """The TransformerConfig of an experiment, its vocabulary sizes taken from the tokenizers:
    `vocab_size` the shared (or target) one's, `source_vocab_size` the source one's when the
    vocabularies are separate (None: shared)."""
    values = dict(config.model)
    for key, size in (("vocab_size", vocab_size), ("source_vocab_size", source_vocab_size)):
        if values.get(key, size) != size:
            raise ConfigError(
                f"model.{key}={values[key]} differs from the tokenizer's {size} pieces; set tokenizer.vocab_size "
                "(or give the tokenizer's model) instead"
            )
    values["vocab_size"] = vocab_size
    values["source_vocab_size"] = source_vocab_size
    values["matmul_dtype"] = resolve_matmul_dtype(values.get("matmul_dtype"))  # "auto": by the machine
    try:
        return TransformerConfig.from_dict(values)
    except FieldError as error:  # the keys as the config (and the user) names them, as its other errors do
        value = error.value.name if isinstance(error.value, np.dtype) else error.value  # a dtype field's, as given
        raise ConfigError(f"config model.{error.field}={value!r}: {error.problem('model.')}") from None


def describe(config: ml_collections.ConfigDict) -> str:
    """A compact print of an experiment config: the model preset, then one `key=value` per key
    that differs from `default_config()` (the model section against its preset)."""
    defaults = flatten(default_config())
    model_defaults = flatten({"model": model_section(config.model.get("preset", "base")).to_dict()})
    changed = []
    for key, value in flatten(config.to_dict()).items():
        default = model_defaults.get(key, "<unset>") if key.startswith("model.") else defaults.get(key, "<unset>")
        if isinstance(value, list):
            value = tuple(value)
        if isinstance(default, list):
            default = tuple(default)
        if value != default and key != "model.preset":
            changed.append(f"{key}={value!r}")
    preset_name = config.model.get("preset", "base")
    return f"config: model preset {preset_name!r}; changed from the defaults: " + (", ".join(changed) or "nothing")
