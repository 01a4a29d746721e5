"""A MarianMT config.json's values as jaxformer's model (see marian.py for the mapping as a whole):
what the conversion reads, checked key by key, each refusal one line naming the key as config.json
names it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jaxformer.interop.marian_layout import ConversionError
from jaxformer.model.config import ConfigError, FieldError, TransformerConfig

# Marian activation names -> jaxformer's; transformers' "gelu" is the exact erf form.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish", "relu2": "squared_relu"}
MARIAN_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default; MarianConfig has no option for it
MARIAN_POSITION_BASE = 10_000.0
MARIAN_MAX_POSITIONS = 1024  # MarianConfig's default max_position_embeddings
# config.json's sizes without a MarianConfig default that could stand for a real model's.
SIZES = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)
# config.json's dropout rates, with MarianConfig's defaults.
DROPOUTS = {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}
# config.json's switches that the conversion reads, with MarianConfig's defaults. A value that is
# not a JSON boolean is refused, as transformers refuses it: Python would read "false" as true.
SWITCHES = {"scale_embedding": False, "tie_word_embeddings": True, "share_encoder_decoder_embeddings": True}
# Keys of transformers < 4 (BART's, which MarianConfig then was) that built another network when
# set otherwise; transformers 5 ignores them. Each with the value of the network converted (OPUS-MT's
# config.json files carry these) and what the other value built.
EARLIER_SWITCHES = {
    "normalize_before": (False, "pre-norm layers"),
    "add_final_layer_norm": (False, "a LayerNorm after each stack"),
    "normalize_embedding": (False, "a LayerNorm on the embeddings"),
    "static_position_embeddings": (True, "learned positions"),
}
# config.json's key for each TransformerConfig field named otherwise (d_model, vocab_size: the same),
# so that a value jaxformer's model refuses is named as the file names it.
MARIAN_KEYS = {
    "num_heads": "encoder_attention_heads",
    "d_ff": "encoder_ffn_dim",
    "max_positions": "max_position_embeddings",
}
MARIAN_KEYS |= {f"num_{stack}_layers": f"{stack}_layers" for stack in ("encoder", "decoder")}
MARIAN_KEYS |= {f"{key}_rate": key for key in ("dropout", "attention_dropout", "activation_dropout")}


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def model_config_from_marian(
    hf: Mapping[str, Any], where: str = "config.json", vocab_size: int | None = None
) -> TransformerConfig:
    """The jaxformer model of a MarianConfig (config.json's values, read from `where`). Its
    vocabulary is `vocab_size` ids (vocabulary_order's, which may add a BOS row), Marian's own
    without it; its tie_output_embedding is what the config implies; `convert_marian` settles
    both from the vocabulary and the weights."""
    for key in SIZES:
        if key not in hf:
            raise ConversionError(f"{where} has no {key!r}: not a complete MarianMT config")
        if not is_count(hf[key]):
            raise ConversionError(f"{where}: {key}={hf[key]!r} is not a positive integer")

    def same(first: str, second: str) -> Any:
        if hf[first] != hf[second]:
            raise ConversionError(
                f"{where}: {first}={hf[first]} differs from {second}={hf[second]}; jaxformer's model has one value for "
                "both stacks, so it cannot convert this model"
            )
        return hf[first]

    if hf.get("model_type", "marian") != "marian":
        raise ConversionError(f"{where}: model_type {hf['model_type']!r} is not a MarianMT model")
    for key, default in {**SWITCHES, **{key: value for key, (value, _) in EARLIER_SWITCHES.items()}}.items():
        if not isinstance(hf.get(key, default), bool):
            raise ConversionError(f"{where}: {key}={json.dumps(hf[key])} is not a JSON boolean (true or false)")
    for key, (converted, other) in EARLIER_SWITCHES.items():
        if hf.get(key, converted) != converted:
            raise ConversionError(
                f"{where}: {key}={json.dumps(hf[key])} declares {other}, which transformers before 4 built and "
                f"transformers 5 ignores; jaxformer converts MarianMT's network ({key}={json.dumps(converted)})"
            )
    if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]):
        raise ConversionError(
            f"{where}: decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size={hf['vocab_size']}"
        )
    max_positions = hf.get("max_position_embeddings", MARIAN_MAX_POSITIONS)
    if not is_count(max_positions):
        raise ConversionError(f"{where}: max_position_embeddings={max_positions!r} is not a positive integer")
    activation = hf.get("activation_function", "gelu")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:  # a list would not even hash
        raise ConversionError(f"{where}: activation_function {activation!r}; supported: {', '.join(ACTIVATIONS)}")
    rates = {key: hf.get(key, default) for key, default in DROPOUTS.items()}
    for key, rate in rates.items():
        if not isinstance(rate, (int, float)) or isinstance(rate, bool):  # transformers' torch dropout fails on it
            raise ConversionError(f"{where}: {key}={json.dumps(rate)} is not a number")
    size = vocab_size or hf["vocab_size"]
    num_heads, d_ff = (
        same("encoder_attention_heads", "decoder_attention_heads"),
        same("encoder_ffn_dim", "decoder_ffn_dim"),
    )
    if hf["d_model"] % num_heads:  # transformers' attention refuses it too
        raise ConversionError(
            f"{where}: d_model={hf['d_model']} is not divisible by encoder_attention_heads={num_heads}"
        )
    try:
        return TransformerConfig(
            vocab_size=size,
            source_vocab_size=size,
            d_model=hf["d_model"],
            num_heads=num_heads,
            d_ff=d_ff,
            num_encoder_layers=hf["encoder_layers"],
            num_decoder_layers=hf["decoder_layers"],
            dropout_rate=float(rates["dropout"]),
            attention_dropout_rate=float(rates["attention_dropout"]),
            activation_dropout_rate=float(rates["activation_dropout"]),
            activation=ACTIVATIONS[activation],
            normalization="post",
            layer_norm_epsilon=MARIAN_LAYER_NORM_EPSILON,
            share_embeddings=False,
            # jaxformer scales embeddings by sqrt(d_model): without Marian's scale_embedding the input
            # embeddings are stored divided by it, so the output projection needs its own kernel.
            tie_output_embedding=bool(hf.get("tie_word_embeddings", True) and hf.get("scale_embedding", False)),
            position_base=MARIAN_POSITION_BASE,
            position_layout="halves",
            max_positions=max_positions,  # transformers refuses longer inputs; translation splits them
            logits_bias=True,
        )
    except FieldError as error:
        key = MARIAN_KEYS.get(error.field, error.field)
        named = f"{key}={hf[key]!r}: {error.problem()}" if key in hf else str(error)
        raise ConversionError(f"{where}: {named}") from error
    except (ConfigError, TypeError, ValueError) as error:
        raise ConversionError(f"{where}: {error}") from error
