"""Writing a jaxformer run as a Hugging Face MarianMT directory (see marian.py for the mapping):
`export_marian(workdir, directory)`, for `MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.export.safetensors import flatten
from jaxformer.interop import marian_output
from jaxformer.interop.marian_files import ACTIVATIONS, MARIAN_LAYER_NORM_EPSILON, MARIAN_POSITION_BASE
from jaxformer.interop.marian_generation import exported_search
from jaxformer.interop.marian_layout import ConversionError, layer_names, to_marian_layout
from jaxformer.model.config import TransformerConfig
from jaxformer.model.position import halves_order
from jaxformer.run.directory import checkpoint_name
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)

# -- writing a transformers directory ----------------------------------------------------------


def logical_axis_names(config: TransformerConfig) -> dict[str, tuple[str, ...]]:
    """Each parameter's logical axis names ("vocab", "embed", ...) by path "a/b/c"."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from jaxformer.model.transformer import Transformer

    tokens = jnp.ones((1, 2), jnp.int32)
    boxed = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), tokens, tokens)["params"])
    leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
    return {"/".join(key.key for key in path): tuple(leaf.names) for path, leaf in leaves}


def permute_axis(
    flat: Mapping[str, np.ndarray], names: Mapping[str, tuple[str, ...]], axis_name: str, order: np.ndarray
) -> dict[str, np.ndarray]:
    """Every parameter (by path) with its axes named `axis_name` reordered by `order`. Over the
    model width ("embed") this gives the same function with a permuted residual stream: every
    weight reading it and writing it, LayerNorm's scale and bias included, moves alike."""
    permuted = {}
    for path, array in flat.items():
        for axis, name in enumerate(names[path]):
            if name == axis_name:
                array = np.take(array, order, axis=axis)
        permuted[path] = array
    return permuted


def marian_weights(
    config: TransformerConfig, params: Mapping[str, Any], where: str = "the parameters"
) -> dict[str, np.ndarray]:
    """Marian's weights (transformers names, one vocabulary) of a post-norm jaxformer model's
    parameters, per layer (`unstack_layers` for a scan_layers model), interleaved positions
    permuted into the halves layout. Equal source and target embeddings (a shared one, or an
    imported model's two copies) are MarianMT's shared form, model.shared with both embed_tokens
    its copies; different ones (an imported model fine-tuned) are the encoder's and decoder's own
    embed_tokens and no model.shared (`share_encoder_decoder_embeddings=false`). An untied output
    layer is lm_head (`tie_word_embeddings=false`): jaxformer's embeddings are scaled as Marian's
    under scale_embedding=true, and its output kernel is lm_head as it is. An array that `config`
    has and the parameters (read from `where`) lack is a ConversionError naming both."""
    flat = {path: np.asarray(value, np.float32) for path, value in flatten(params).items()}

    def array(path: str) -> np.ndarray:
        if path not in flat:
            why = " (tie_output_embedding=False: an output layer of its own)" if path == "decoder/logits_kernel" else ""
            raise ConversionError(f"{where} holds no {path}, which its metadata's model has{why}")
        return flat[path]

    if config.position_layout == "interleaved":
        # The axis names of the parameters as given, per layer: a scan_layers model's would be
        # of its stacked tree, whose paths these are not.
        names = logical_axis_names(dataclasses.replace(config, scan_layers=False))
        flat = permute_axis(flat, names, "embed", halves_order(config.d_model))
    if config.share_embeddings:
        source = target = array("shared_embedding/embedding")
    else:
        source, target = array("source_embedding/embedding"), array("target_embedding/embedding")
    bias = flat.get("decoder/logits_bias", np.zeros(config.vocab_size, np.float32))
    weights = {
        "model.encoder.embed_tokens.weight": source,
        "model.decoder.embed_tokens.weight": target,
        "lm_head.weight": target if config.tie_output_embedding else array("decoder/logits_kernel").T,
        "final_logits_bias": bias.reshape(1, -1),
    }
    if np.array_equal(source, target):
        weights["model.shared.weight"] = target
    for path, name, kind in layer_names(config):
        weights[name] = to_marian_layout(kind, array(path))
    return weights


def check_exportable(config: TransformerConfig) -> None:
    """`ConversionError` naming the option when the model has no MarianMT form."""
    problems = {
        "architecture": config.architecture != "encoder_decoder",
        "normalization": config.normalization != "post",
        "position_base": config.position_base != MARIAN_POSITION_BASE,
        "source_vocab_size": config.encoder_vocab_size != config.vocab_size,
    }
    for option, problem in problems.items():
        if problem:
            raise ConversionError(
                f"TransformerConfig.{option}={getattr(config, option)!r} has no MarianMT form (MarianMT is a "
                "post-norm encoder-decoder with 10000-based sinusoids and one vocabulary)"
            )
    operands = np.dtype(config.matmul_operand_dtype)
    if operands.itemsize < 4:
        # The metadata holds the run's resolved model: matmul_dtype="auto" is here what it became
        # on the training machine (bfloat16 where bf16 products are native, jaxformer/hardware.py).
        setting = "dtype" if config.matmul_dtype is None else "matmul_dtype"
        logger.warning(
            "the run's weight products take %s inputs (model.%s=%s), transformers' take float32 ones: its "
            "logits differ from the run's by about 1e-2 and its translations can differ, much more than the "
            "LayerNorm epsilon's 1e-6",
            operands.name,
            setting,
            operands.name,
        )
    if config.layer_norm_epsilon != MARIAN_LAYER_NORM_EPSILON:
        logger.warning(
            "layer_norm_epsilon=%g; MarianMT's LayerNorm uses %g, which changes the outputs slightly (about 1e-6)",
            config.layer_norm_epsilon,
            MARIAN_LAYER_NORM_EPSILON,
        )


# max_position_embeddings of a run whose model has no last position (model.max_positions None).
DEFAULT_MAX_POSITIONS = 512


def exported_positions(config: TransformerConfig, requested: int | None) -> int:
    """max_position_embeddings of a run's export: `requested`, else the model's own max_positions
    (an imported model's, so a round trip keeps it), else DEFAULT_MAX_POSITIONS; a ConversionError
    where `requested` is more than the model has, positions it never had."""
    if requested is None:
        return config.max_positions or DEFAULT_MAX_POSITIONS
    if config.max_positions is not None and requested > config.max_positions:
        raise ConversionError(
            f"max_positions={requested} is more than the {config.max_positions} positions the run's model has "
            "(model.max_positions)"
        )
    return requested


def marian_config(
    config: TransformerConfig, max_positions: int = DEFAULT_MAX_POSITIONS, shared: bool = True
) -> dict[str, Any]:
    """MarianConfig's values for a jaxformer model (its own ids: pad 0, eos 1, decoder start BOS 3)
    whose encoder and decoder embeddings are one matrix, model.shared (`shared`), or two."""
    # The import's map read backwards; its first name for an activation ("swish" before the alias "silu").
    activation = next(marian for marian, ours in ACTIVATIONS.items() if ours == config.activation)
    return {
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.num_encoder_layers,
        "decoder_layers": config.num_decoder_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": activation,
        "dropout": config.dropout_rate,
        "attention_dropout": config.attention_dropout_rate,
        "activation_dropout": config.activation_dropout_rate,
        "max_position_embeddings": max_positions,
        "scale_embedding": True,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "forced_eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID,
        "share_encoder_decoder_embeddings": shared,
        "tie_word_embeddings": config.tie_output_embedding,
    }


def _piece_names(tokenizer: Tokenizer) -> list[str]:
    return tokenizer.pieces(range(tokenizer.vocab_size))


def export_marian(
    workdir: str | os.PathLike,
    output: str | os.PathLike,
    checkpoint: str | int = "latest",
    max_positions: int | None = None,
    on_placed: Callable[[], None] | None = None,
) -> pathlib.Path:
    """Writes a run's checkpoint as a transformers MarianMT directory `output` (new or empty):
    config.json, model.safetensors, generation_config.json, source.spm, target.spm, vocab.json and
    tokenizer_config.json, with `max_positions` positions (`exported_positions`), written whole or
    not at all (marian_output.py; `on_placed()` once in place). Needs the interop extra (torch,
    transformers). Returns the folder written: `output`, or where a link there points."""
    from jaxformer.model.transformer import unstack_layers
    from jaxformer.run.loading import load_checkpoint

    output = marian_output.check_new_output(output, marian_output.TRANSFORMERS_DIRECTORY)
    settled = {}  # the checkpoint's exportable form, from its metadata before its parameters are read

    def settle(metadata: CheckpointMetadata) -> None:
        config = metadata.model_config()
        settled["max_positions"] = exported_positions(config, max_positions)
        # The tokenizers first: two vocabularies of different sizes are also a source_vocab_size that
        # check_exportable refuses, in words that do not name the option the run set.
        source, target = metadata.load_tokenizer(), metadata.load_target_tokenizer()
        if _piece_names(target) != _piece_names(source):
            raise ConversionError(
                "the run's source and target tokenizers have different vocabularies: MarianMT's vocab.json is one "
                "vocabulary over both (a run with tokenizer.separate_vocabularies=True exports only when its two "
                "tokenizers share their pieces, as an imported model's do)"
            )
        check_exportable(config)
        settled["tokenizers"] = source, target

    step, metadata, params = load_checkpoint(workdir, checkpoint, before_params=settle)
    config, max_positions = metadata.model_config(), settled["max_positions"]
    source, target = settled["tokenizers"]
    pieces = _piece_names(source)
    if config.scan_layers:
        params = unstack_layers(params)
    weights = marian_weights(config, params, f"step {step} of {workdir} ({checkpoint_name(checkpoint)})")

    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    shared = "model.shared.weight" in weights
    model = MarianMTModel(MarianConfig(**marian_config(config, max_positions, shared)))
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    leftover = [name for name in missing if "embed_positions" not in name]
    if leftover or unexpected:
        raise ConversionError(f"transformers' MarianMTModel does not take these weights: {leftover or unexpected}")
    decoding = metadata.config.get("decoding", {})
    # The run's search: final/'s alpha is the one its choice kept, another checkpoint's decoding.alpha.
    alpha = metadata.alpha if metadata.alpha is not None else decoding.get("alpha", DecodeSettings.alpha)
    search, unexpressed = exported_search(decoding, alpha)
    if unexpressed:
        logger.warning("%s", unexpressed)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=BOS_ID,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        bad_words_ids=[[PAD_ID], [BOS_ID]],
        max_length=max_positions,
        # how the run scores (an import of a model that sets it); GenerationConfig writes only true
        renormalize_logits=bool(decoding.get("renormalize_after_bans")),
        **search,
    )
    with marian_output.written_whole(output, marian_output.TRANSFORMERS_DIRECTORY, on_placed) as staging:
        from transformers.utils import logging as transformers_logging

        bar_was_on = transformers_logging.is_progress_bar_enabled()
        if not sys.stderr.isatty():  # its shard-writing bar redraws with carriage returns into a redirected log
            transformers_logging.disable_progress_bar()
        try:
            model.save_pretrained(staging)
        finally:
            if bar_was_on:
                transformers_logging.enable_progress_bar()
        (staging / "source.spm").write_bytes(source.model_proto)
        (staging / "target.spm").write_bytes(target.model_proto)
        (staging / "vocab.json").write_text(json.dumps({piece: index for index, piece in enumerate(pieces)}, indent=2))
        languages = metadata.config.get("data", {})
        tokenizer = MarianTokenizer(
            str(staging / "source.spm"),
            str(staging / "target.spm"),
            str(staging / "vocab.json"),
            source_lang=languages.get("source_language"),
            target_lang=languages.get("target_language"),
            unk_token=pieces[UNK_ID],
            eos_token=pieces[EOS_ID],
            pad_token=pieces[PAD_ID],
            model_max_length=max_positions,  # its truncation: the positions the model has
        )
        tokenizer.save_pretrained(staging)
    logger.info("wrote step %d of %s (%s) to %s", step, workdir, checkpoint_name(checkpoint), output)
    return output
