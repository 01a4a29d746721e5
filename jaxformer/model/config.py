"""The model's one frozen configuration, its named presets and its validation.

Every module receives the whole `TransformerConfig`; an evaluation variant is
`config.replace(deterministic=True)`, a bf16 one `config.replace(dtype="bfloat16")`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np

from jaxformer.errors import UserError
from jaxformer.tokens import NUM_SPECIAL_TOKENS


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the field and the value."""


class FieldName(str):
    """Another field a FieldError's problem names (`must be divisible by num_heads=4`): an
    experiment config names it as its key (`model.num_heads=4`)."""


class FieldError(ConfigError):
    """A TransformerConfig field's invalid value: "TransformerConfig.FIELD=VALUE: PROBLEM", its parts
    kept (the problem's as text and the FieldName of each other field it names) so that an
    experiment config names its own keys instead (`config model.FIELD=...: ... model.OTHER=...`)."""

    def __init__(self, field: str, value: Any, *problem: str):
        self.field, self.value, self.parts = field, value, problem
        super().__init__(f"TransformerConfig.{field}={value!r}: {self.problem()}")

    def problem(self, prefix: str = "") -> str:
        """The problem, each other field it names as `prefix` and its name."""
        return "".join(prefix + part if isinstance(part, FieldName) else part for part in self.parts)

    def __reduce__(self):  # pickled with its parts (the message alone is no argument list)
        return type(self), (self.field, self.value, *self.parts)


def set_python_scalar_fields(instance: Any) -> None:
    """Replaces each numpy scalar (`numpy.int64(64)`) in the fields of the frozen dataclass
    `instance` with its Python value: a value computed with numpy then passes the type checks and
    compares, hashes and serialises as the plain one would. For `__post_init__`."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if isinstance(value, np.generic):
            object.__setattr__(instance, field.name, value.item())


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer (Vaswani et al., 2017).

    Defaults are the paper's base model with its shared 37,000-token vocabulary.
    """

    # "encoder_decoder": the translator (Figure 1); "encoder_only": the encoder with a masked-LM
    # head; "decoder_only": the decoder without cross-attention, a causal language model.
    architecture: Literal["encoder_decoder", "encoder_only", "decoder_only"] = "encoder_decoder"

    # Shared source/target vocabulary size, special tokens (jaxformer.tokens) included; with
    # separate vocabularies, the target's (decoder embedding and output softmax).
    vocab_size: int = 37_000
    # The source vocabulary's size when it differs from the target's (separate vocabularies,
    # share_embeddings=False); None: the same as vocab_size.
    source_vocab_size: int | None = None
    # Width of every residual stream, embedding and attention output (d_model).
    d_model: int = 512
    # Attention heads per layer; d_model must be a multiple of it (head size d_model / num_heads).
    num_heads: int = 8
    # Inner width of the position-wise feed-forward network (d_ff).
    d_ff: int = 2048
    # Encoder and decoder stack depths (N in the paper).
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    # Dropout on embeddings + positional encoding and on every sub-layer output (P_drop).
    dropout_rate: float = 0.1
    # Dropout on the attention weights (0 in the paper).
    attention_dropout_rate: float = 0.0
    # Dropout after the feed-forward activation (0 in the paper).
    activation_dropout_rate: float = 0.0
    # Word dropout (Gal and Ghahramani 2016; Sennrich and Zhang 2019; Marian's --dropout-src and
    # --dropout-trg): each token's whole embedding zeroed with this probability before the positional
    # encoding is added (the rest scaled by 1 / (1 - rate)), in the encoder's input (source) and the
    # decoder's (target; a decoder-only model's tokens). 0 in the paper.
    source_word_dropout_rate: float = 0.0
    target_word_dropout_rate: float = 0.0
    # Feed-forward activation: "relu" (the paper), "gelu" (exact erf form), "swish" (SiLU, x * sigmoid(x))
    # or "squared_relu" (relu(x)^2, So et al. 2021's Primer).
    activation: Literal["relu", "gelu", "swish", "squared_relu"] = "relu"
    # "post": LayerNorm(x + Sublayer(x)) as in the paper; "pre": x + Sublayer(LayerNorm(x)),
    # with a final LayerNorm after each stack.
    normalization: Literal["post", "pre"] = "post"
    layer_norm_epsilon: float = 1e-6
    # One embedding matrix for source and target tokens.
    share_embeddings: bool = True
    # Output softmax weights are the (target) embedding matrix, transposed.
    tie_output_embedding: bool = True
    # Base of the sinusoidal positional encoding (10000 in the paper).
    position_base: float = 10_000.0
    # Where the sinusoids sit along d_model: "interleaved" (sin, cos of each frequency in turn, the
    # paper's formula) or "halves" (the sines of every frequency, then their cosines).
    position_layout: Literal["interleaved", "halves"] = "interleaved"
    # The positions the model has, or None: the sinusoids have no last one. An imported MarianMT
    # model's max_position_embeddings, which transformers holds every input and output to:
    # translation splits longer sources as max_source_tokens does and ends outputs there
    # (decoding/generate.py's output_limits). The model itself computes any position asked of it.
    # encoder_decoder only (a language model's generation has no such limit).
    max_positions: int | None = None
    # A learned output bias [V] added to the logits (decoder/logits_bias); encoder_decoder only.
    logits_bias: bool = False
    # Compute dtype of activations and matmuls; softmax and LayerNorm statistics stay float32.
    dtype: Any = "float32"
    # Storage dtype of the parameters.
    param_dtype: Any = "float32"
    # Operand dtype of the weight matmuls (Q, K, V, W^O, the feed-forward pair, the output
    # projection): their inputs are rounded to it, every product (forward and both gradients)
    # accumulated in float32 and returned in `dtype`. None: `dtype`. "bfloat16" under a float32
    # `dtype` is what a TPU's default matmul precision does anyway: the residual stream,
    # LayerNorm, softmax and attention scores stay float32, only the weight products' inputs lose
    # bits; on CPUs with bf16 dot instructions (AVX512-BF16) the train step runs 1.3-1.4x faster.
    # (The masked-LM head's dense transform, encoder_only, computes in `dtype`.)
    matmul_dtype: Any = None
    # True disables every dropout (evaluation, decoding).
    deterministic: bool = False
    # Rematerialisation per layer: "none", "full" (save nothing, recompute the layer in the
    # backward pass), "dots" (save matmul outputs) or "dots_no_batch" (save weight matmuls only).
    remat_policy: Literal["none", "full", "dots", "dots_no_batch"] = "none"
    # One nn.scan over each stack (parameters stacked on a leading "layers" axis): compile time
    # independent of depth.
    scan_layers: bool = False
    # "jaxformer": the float32-softmax einsum path; "xla" or "cudnn": jax.nn.dot_product_attention
    # (cuDNN's fused kernel on GPU), used when attention dropout is off; "cudnn" falls back to
    # "xla" where cuDNN cannot run (no GPU, float32, unsupported shapes).
    attention_implementation: Literal["jaxformer", "xla", "cudnn"] = "jaxformer"

    def __post_init__(self):
        set_python_scalar_fields(self)  # so configs compare and hash alike
        for name in _DTYPE_FIELDS:
            object.__setattr__(self, name, _model_dtype(name, getattr(self, name)))
        _validate(self)

    @property
    def encoder_vocab_size(self) -> int:
        """Rows of the source embedding: source_vocab_size, or vocab_size when that is None."""
        return self.vocab_size if self.source_vocab_size is None else self.source_vocab_size

    @property
    def matmul_operand_dtype(self) -> jnp.dtype:
        """What the weight matmuls' inputs are rounded to: matmul_dtype, or dtype when that is None."""
        return self.dtype if self.matmul_dtype is None else self.matmul_dtype

    @property
    def head_dim(self) -> int:
        """H: the size of one attention head."""
        return self.d_model // self.num_heads

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with `changes` applied (and validated); unknown fields are an error."""
        _check_known_fields(changes, "TransformerConfig.replace")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TransformerConfig:
        """Builds a config from a mapping (e.g. an ml_collections ConfigDict's `model`).

        A key "preset" names the starting point (default "base"); the other keys override it.
        """
        values = dict(values)
        preset_name = values.pop("preset", "base")
        _check_known_fields(values, "model config")
        return preset(preset_name, **values)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (dtypes as names), for logging and checkpoint metadata."""
        values = dataclasses.asdict(self)
        for name in _DTYPE_FIELDS:
            values[name] = None if values[name] is None else values[name].name
        return values


ARCHITECTURES = ("encoder_decoder", "encoder_only", "decoder_only")
# The compute and storage dtypes the model runs in; float64 is not one (the projections refuse
# operands wider than their float32 inputs, and jax stores float64 parameters as float32 unless
# jax_enable_x64 is set).
MODEL_DTYPES = ("float32", "bfloat16", "float16")
ACTIVATIONS = ("relu", "gelu", "swish", "squared_relu")  # the feed-forward non-linearities (model/layers.py)
_DTYPE_FIELDS = ("dtype", "param_dtype", "matmul_dtype")  # normalised to jnp.dtype; names in to_dict
_DROPOUT_FIELDS = (
    "dropout_rate",
    "attention_dropout_rate",
    "activation_dropout_rate",
    "source_word_dropout_rate",
    "target_word_dropout_rate",
)
_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(TransformerConfig))
# What each float field takes, as `_validate` says it: an experiment config's --config.model.KEY=nan
# is refused with it as the override is read.
FLOAT_FIELD_RULES = {
    **{field: "must lie in [0, 1)" for field in _DROPOUT_FIELDS},
    "layer_norm_epsilon": "must be a finite number > 0",
    "position_base": "must be a finite number greater than 1",
}


def check_architecture(config: TransformerConfig, architecture: str, user: str) -> None:
    """A ConfigError when `config` is of another architecture than `user` (a model class, a
    function) builds, found when it is constructed rather than at its first init or apply."""
    if config.architecture != architecture:
        raise ConfigError(
            f"{user} needs a config with architecture={architecture!r}, got architecture={config.architecture!r} "
            "(build_model(config) builds the model of a config's architecture)"
        )


def _model_dtype(name: str, value: Any) -> jnp.dtype | None:
    """`value` of the dtype field `name` as a jnp.dtype; a ConfigError unless it is one of MODEL_DTYPES
    (or None for matmul_dtype: dtype's own)."""
    if value is None and name == "matmul_dtype":
        return None
    allowed = f"one of {', '.join(map(repr, MODEL_DTYPES))}"
    if name == "matmul_dtype":  # also read from experiment configs, where "auto" is resolved before it gets here
        allowed += " or None (an experiment config's 'auto' is resolved to one of them by jaxformer/hardware.py)"
    try:
        dtype = None if value is None else jnp.dtype(value)  # jnp.dtype(None) would be float64
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.name not in MODEL_DTYPES:
        raise FieldError(name, value, f"must be {allowed}")
    return dtype


def _check_known_fields(values: Mapping[str, Any], where: str) -> None:
    for key in values:
        if key not in _FIELD_NAMES:
            near = difflib.get_close_matches(key, _FIELD_NAMES, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(near)}?" if near else "."
            raise ConfigError(f"unknown key {key!r} in {where}{hint} Known keys: {', '.join(_FIELD_NAMES)}.")


def _number(value: Any) -> bool:  # numpy scalars are Python's by now (__post_init__)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(config: TransformerConfig) -> None:
    def fail(field: str, *problem: str) -> None:  # another field named in the problem: a FieldName
        raise FieldError(field, getattr(config, field), *problem)

    for field in ("vocab_size", "d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers"):
        value = getattr(config, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            fail(field, "must be a positive integer")
    if config.d_model % config.num_heads:
        fail("d_model", "must be divisible by ", FieldName("num_heads"), f"={config.num_heads}")
    if config.d_model % 2:
        fail("d_model", "must be even for the sinusoidal positional encoding")
    if config.vocab_size <= NUM_SPECIAL_TOKENS:
        fail("vocab_size", f"must exceed the {NUM_SPECIAL_TOKENS} special tokens (pad, eos, unk, bos)")
    if config.source_vocab_size is not None:
        value = config.source_vocab_size
        if not isinstance(value, int) or isinstance(value, bool) or value <= NUM_SPECIAL_TOKENS:
            fail("source_vocab_size", f"must be None or an integer above the {NUM_SPECIAL_TOKENS} special tokens")
        # A language model's source_vocab_size is refused below whatever it is: "set share_embeddings=False"
        # would lead to a second refusal.
        if value != config.vocab_size and config.share_embeddings and config.architecture == "encoder_decoder":
            fail(
                "source_vocab_size",
                "differs from ",
                FieldName("vocab_size"),
                f"={config.vocab_size}, so source and target cannot share one embedding matrix: set ",
                FieldName("share_embeddings"),
                "=False",
            )
    for field in _DROPOUT_FIELDS:
        value = getattr(config, field)
        if not _number(value) or not 0.0 <= value < 1.0:
            fail(field, FLOAT_FIELD_RULES[field])
    if config.architecture not in ARCHITECTURES:
        fail("architecture", f"must be one of {', '.join(map(repr, ARCHITECTURES))}")
    # A field of translation's alone: named with the key whose value rules it out.
    translation_only = (
        "applies to ",
        FieldName("architecture"),
        f"='encoder_decoder' only, not {config.architecture!r}",
    )
    if config.architecture != "encoder_decoder" and config.source_vocab_size is not None:
        fail("source_vocab_size", *translation_only)
    if config.architecture != "encoder_decoder" and not config.share_embeddings:
        untie = ("; untie its output layer with ", FieldName("tie_output_embedding"), "=False")
        fail(
            "share_embeddings",
            FieldName("architecture"),
            f"={config.architecture!r} has one embedding matrix, nothing to share or separate",
            *(untie if config.architecture == "decoder_only" else ()),
        )
    if config.architecture == "encoder_only" and not config.tie_output_embedding:
        masked_lm = "='encoder_only': its masked-LM head is always tied to its embedding"
        fail("tie_output_embedding", FieldName("architecture"), masked_lm)
    if config.architecture == "decoder_only" and config.source_word_dropout_rate:
        fail(
            "source_word_dropout_rate",
            FieldName("architecture"),
            "='decoder_only' has no source: use ",
            FieldName("target_word_dropout_rate"),
        )
    if config.architecture == "encoder_only" and config.target_word_dropout_rate:
        fail(
            "target_word_dropout_rate",
            FieldName("architecture"),
            "='encoder_only' has no decoder input: use ",
            FieldName("source_word_dropout_rate"),
        )
    if config.activation not in ACTIVATIONS:
        fail("activation", f"must be one of {', '.join(map(repr, ACTIVATIONS))}")
    if config.max_positions is not None and (
        not isinstance(config.max_positions, int) or isinstance(config.max_positions, bool) or config.max_positions < 2
    ):
        fail("max_positions", "must be None or an integer >= 2 (a token and EOS)")
    if config.position_layout not in ("interleaved", "halves"):
        fail("position_layout", 'must be "interleaved" (the paper) or "halves"')
    for field in ("share_embeddings", "tie_output_embedding", "logits_bias", "deterministic", "scan_layers"):
        if not isinstance(getattr(config, field), bool):
            fail(field, "must be True or False")
    if config.logits_bias and config.architecture != "encoder_decoder":
        fail("logits_bias", *translation_only)
    if config.max_positions is not None and config.architecture != "encoder_decoder":  # only translation obeys it
        fail("max_positions", *translation_only)
    if config.normalization not in ("post", "pre"):
        fail("normalization", 'must be "post" (the paper) or "pre"')
    if config.remat_policy not in ("none", "full", "dots", "dots_no_batch"):
        fail("remat_policy", 'must be "none", "full", "dots" or "dots_no_batch"')
    if config.attention_implementation not in ("jaxformer", "xla", "cudnn"):
        fail("attention_implementation", 'must be "jaxformer", "xla" or "cudnn"')
    if not _number(config.layer_norm_epsilon) or not 0 < config.layer_norm_epsilon < math.inf:
        fail("layer_norm_epsilon", FLOAT_FIELD_RULES["layer_norm_epsilon"])
    if not _number(config.position_base) or not 1 < config.position_base < math.inf:  # inf: every position alike
        fail("position_base", FLOAT_FIELD_RULES["position_base"])
    if config.matmul_dtype is not None and jnp.finfo(config.matmul_dtype).bits > jnp.finfo(config.dtype).bits:
        fail("matmul_dtype", "must not be wider than ", FieldName("dtype"), f"={config.dtype.name}")


# Named sizes. `base` and `big` are the paper's Table 3 models; `tiny` runs in seconds on a CPU.
_PRESET_FIELDS = "vocab_size d_model num_heads d_ff num_encoder_layers num_decoder_layers dropout_rate".split()
# fmt: off
PRESETS: dict[str, dict[str, Any]] = {
    name: dict(zip(_PRESET_FIELDS, values))
    for name, values in {
        "tiny": (    64,   32,  4,   64, 2, 2, 0.1),
        "base": (37_000,  512,  8, 2048, 6, 6, 0.1),
        "big":  (37_000, 1024, 16, 4096, 6, 6, 0.3),
    }.items()
}
# fmt: on


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """The named preset ("tiny", "base" or "big") with `overrides` applied."""
    if not isinstance(name, str) or name not in PRESETS:  # a list or dict: not "unhashable type"
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    _check_known_fields(overrides, f"preset {name!r} overrides")
    return TransformerConfig(**{**PRESETS[name], **overrides})
