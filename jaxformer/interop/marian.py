"""Hugging Face MarianMT models (the OPUS-MT translation models) to and from jaxformer runs.

`import_marian(directory, workdir)` reads a transformers MarianMT directory (config.json,
model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json) into a jaxformer run
directory that `Translator.from_workdir`, jaxformer-translate, jaxformer-evaluate,
`training.init_from` and jaxformer-export read as they read a trained run's.
`export_marian(workdir, directory)` (marian_export.py) writes a run's checkpoint in that format,
for `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained`.

Marian is the same post-norm encoder-decoder; what differs maps onto model options:

- the sinusoids: the sines of all frequencies, then the cosines (`position_layout="halves"`);
- a learned output bias, Marian's final_logits_bias (`logits_bias=True`);
- the activation ("swish" in many OPUS-MT models), LayerNorm epsilon 1e-5;
- the vocabulary: one vocab.json over both languages, with a source and a target sentencepiece
  model. jaxformer keeps its separate-vocabulary path (`share_embeddings=False`, both embeddings
  copies of Marian's shared matrix) with one sentencepiece model per side whose piece ids ARE the
  model's ids (pieces a side's .spm lacks are UNUSED there: never produced);
- ids: jaxformer's pad 0, eos 1, unk 2, bos 3 are Marian's pad, eos and unk, then a BOS row that
  copies Marian's decoder start token's (its pad) embedding row and bias entry, then every other
  token in Marian's order. jaxformer's decoder starts from BOS, so it starts from the vector
  Marian's starts from, and bans pad and BOS as Marian's generation config bans pad. BOS's logit
  is the start token's minus `BOS_LOGIT_OFFSET`, so the extra row takes no probability;
- the beam search's length penalty: `DecodeSettings(length_penalty="transformers")` is
  transformers' |Y|^alpha.

The other way, a jaxformer run keeps its ids (Marian's pad, eos and decoder start are then 0, 1
and 3); interleaved positions are exported exactly by permuting the model width (every weight's
"embed" axis) into the halves layout. Pre-norm models have no Marian form.

torch and transformers (the `interop` extra) are imported only where a file format needs them:
reading pytorch_model.bin, and writing the transformers directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.export.safetensors import read_safetensors, unflatten
from jaxformer.interop.marian_layout import (
    ConversionError,
    layer_names,
    to_jaxformer_layout,
    vocabulary_order,
)
from jaxformer.model.config import TransformerConfig
from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID

Piece = model_pb2.ModelProto.SentencePiece

# Marian activation names -> jaxformer's; transformers' "gelu" is the exact erf form.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish", "relu2": "squared_relu"}
MARIAN_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default; MarianConfig has no option for it
MARIAN_POSITION_BASE = 10_000.0
# The BOS row repeats the decoder start token's (pad's) embedding; its logit is that token's minus
# this, so it takes a share e^-100 of the probability: none in float32, the softmax stays Marian's.
BOS_LOGIT_OFFSET = 100.0
LANGUAGE_CODE = re.compile(r"^>>.+<<$")  # multilingual models' target-language tokens, e.g. >>de<<


def side_model_proto(spm_proto: bytes, pieces: Sequence[str], where: str) -> bytes:
    """A sentencepiece model for one side whose piece ids are the model's jaxformer ids: `pieces`
    (the piece of each id, pad, eos, unk and BOS first) with the type and score the side's model
    `spm_proto` gives them, UNUSED (never produced) where it has no such piece; its normalizer
    and trainer settings kept, so text splits as that model splits it."""
    original = model_pb2.ModelProto()
    original.ParseFromString(spm_proto)
    by_name = {piece.piece: piece for piece in original.pieces}
    producible = (Piece.NORMAL, Piece.USER_DEFINED, Piece.BYTE)
    wanted = set(pieces)
    dropped = [p.piece for p in original.pieces if p.type in producible and p.piece not in wanted]
    if dropped:
        logging.warning(
            "%s has %d pieces that vocab.json lacks (e.g. %s); MarianTokenizer maps them to <unk>, jaxformer's "
            "tokenizer segments without them, so text containing them may tokenize differently",
            where,
            len(dropped),
            ", ".join(map(repr, dropped[:5])),
        )
    # A character the side's model does not know comes out of it as an unknown piece whose text
    # MarianTokenizer looks up in vocab.json: where the vocabulary has that character alone (the
    # other side's), it is a piece here, scored below everything so that segmentation is unchanged
    # (no other piece of this side contains the character).
    alphabet = {char for piece in original.pieces if piece.type in producible for char in piece.piece}
    scores = [piece.score for piece in original.pieces if piece.type == Piece.NORMAL]
    unknown_score = (min(scores) if scores else 0.0) - 10.0
    model = model_pb2.ModelProto()
    model.CopyFrom(original)
    del model.pieces[:]
    special_types = (Piece.CONTROL, Piece.CONTROL, Piece.UNKNOWN, Piece.CONTROL)  # pad, eos, unk, bos
    for index, name in enumerate(pieces):
        if index < NUM_SPECIAL_TOKENS:
            model.pieces.append(Piece(piece=name, score=0.0, type=special_types[index]))
        elif name in by_name and by_name[name].type in producible:
            model.pieces.append(Piece(piece=name, score=by_name[name].score, type=by_name[name].type))
        elif len(name) == 1 and name not in alphabet and not LANGUAGE_CODE.match(name):
            model.pieces.append(Piece(piece=name, score=unknown_score, type=Piece.NORMAL))
        else:
            model.pieces.append(Piece(piece=name, score=0.0, type=Piece.UNUSED))
    spec = model.trainer_spec
    for role, jaxformer_id in (("pad", PAD_ID), ("eos", EOS_ID), ("unk", UNK_ID), ("bos", BOS_ID)):
        setattr(spec, f"{role}_id", jaxformer_id)
        setattr(spec, f"{role}_piece", pieces[jaxformer_id])
    spec.vocab_size = len(pieces)
    return model.SerializeToString(deterministic=True)


# -- reading a transformers directory ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MarianDirectory:
    """What a transformers MarianMT directory holds."""

    config: dict[str, Any]  # config.json
    weights: dict[str, np.ndarray]  # by transformers name, float32
    vocab: dict[str, int]  # vocab.json
    source_spm: bytes
    target_spm: bytes
    tokenizer_config: dict[str, Any]  # tokenizer_config.json, {} without one


def _read_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConversionError(f"cannot read {path}: {error.strerror or error}") from error
    except json.JSONDecodeError as error:
        raise ConversionError(f"{path} is not JSON: {error}") from error


def _read_weights(directory: pathlib.Path) -> dict[str, np.ndarray]:
    if (directory / "model.safetensors").is_file():
        tensors = read_safetensors(directory / "model.safetensors")
    elif (directory / "pytorch_model.bin").is_file():
        import torch  # the interop extra

        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        tensors = {name: value.float().numpy() for name, value in state.items()}
    else:
        raise ConversionError(f"{directory} holds neither model.safetensors nor pytorch_model.bin")
    return {name: np.asarray(value, np.float32) for name, value in tensors.items()}


def read_marian_directory(directory: str | os.PathLike) -> MarianDirectory:
    """The files of a transformers MarianMT directory; `ConversionError` naming a missing one."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise ConversionError(f"{directory} is not a directory")
    for name in ("config.json", "vocab.json", "source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise ConversionError(f"{directory} has no {name}: not a transformers MarianMT directory")
    if (directory / "target_vocab.json").is_file():
        raise ConversionError(f"{directory} has a target_vocab.json: separate Marian vocabularies are not supported")
    tokenizer_config = directory / "tokenizer_config.json"
    return MarianDirectory(
        config=_read_json(directory / "config.json"),
        weights=_read_weights(directory),
        vocab=_read_json(directory / "vocab.json"),
        source_spm=(directory / "source.spm").read_bytes(),
        target_spm=(directory / "target.spm").read_bytes(),
        tokenizer_config=_read_json(tokenizer_config) if tokenizer_config.is_file() else {},
    )


def model_config_from_marian(hf: Mapping[str, Any]) -> TransformerConfig:
    """The jaxformer model of a MarianConfig (config.json's values)."""

    def same(first: str, second: str) -> Any:
        if hf[first] != hf[second]:
            raise ConversionError(f"config.json: {first}={hf[first]} differs from {second}={hf[second]}")
        return hf[first]

    if hf.get("model_type", "marian") != "marian":
        raise ConversionError(f"config.json: model_type {hf['model_type']!r} is not a MarianMT model")
    if not hf.get("share_encoder_decoder_embeddings", True):
        raise ConversionError(
            "config.json: share_encoder_decoder_embeddings=false (separate vocabularies) is unsupported"
        )
    if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]):
        raise ConversionError(f"config.json: decoder_vocab_size differs from vocab_size={hf['vocab_size']}")
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise ConversionError(f"config.json: activation_function {activation!r}; supported: {', '.join(ACTIVATIONS)}")
    size = hf["vocab_size"] + 1  # the BOS row
    return TransformerConfig(
        vocab_size=size,
        source_vocab_size=size,
        d_model=hf["d_model"],
        num_heads=same("encoder_attention_heads", "decoder_attention_heads"),
        d_ff=same("encoder_ffn_dim", "decoder_ffn_dim"),
        num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        dropout_rate=float(hf.get("dropout", 0.1)),
        attention_dropout_rate=float(hf.get("attention_dropout", 0.0)),
        activation_dropout_rate=float(hf.get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[activation],
        normalization="post",
        layer_norm_epsilon=MARIAN_LAYER_NORM_EPSILON,
        share_embeddings=False,
        # jaxformer scales embeddings by sqrt(d_model): without Marian's scale_embedding the input
        # embeddings are stored divided by it, so the output projection needs its own kernel.
        tie_output_embedding=bool(hf.get("tie_word_embeddings", True) and hf.get("scale_embedding", False)),
        position_base=MARIAN_POSITION_BASE,
        position_layout="halves",
        logits_bias=True,
    )


def _shared_embedding(weights: Mapping[str, np.ndarray]) -> np.ndarray:
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        if name in weights:
            return weights[name]
    if "lm_head.weight" in weights:
        return weights["lm_head.weight"]
    raise ConversionError("the weights hold no embedding (model.shared.weight)")


def params_from_marian(
    hf: Mapping[str, Any], weights: Mapping[str, np.ndarray], config: TransformerConfig, order: np.ndarray
) -> dict[str, Any]:
    """jaxformer parameters (separate vocabularies) of Marian weights; `order` from `vocabulary_order`."""
    missing = [name for _, name, _ in layer_names(config) if name not in weights]
    if missing:
        raise ConversionError(f"the weights lack {len(missing)} layer parameters, e.g. {missing[0]}")
    flat = {
        path: to_jaxformer_layout(kind, weights[name], config.num_heads) for path, name, kind in layer_names(config)
    }
    shared = _shared_embedding(weights)
    if shared.shape != (config.vocab_size - 1, config.d_model):
        raise ConversionError(
            f"the embedding has shape {shared.shape}, not ({config.vocab_size - 1}, {config.d_model})"
        )
    embedding = shared[order]
    if not hf.get("scale_embedding", False):
        embedding = embedding / np.float32(math.sqrt(config.d_model))
    flat["source_embedding/embedding"] = flat["target_embedding/embedding"] = embedding
    if not config.tie_output_embedding:
        output = weights["lm_head.weight"] if not hf.get("tie_word_embeddings", True) else shared
        flat["decoder/logits_kernel"] = output[order].T
    bias = weights.get("final_logits_bias", np.zeros((1, config.vocab_size - 1), np.float32)).reshape(-1)[order]
    bias[BOS_ID] -= BOS_LOGIT_OFFSET
    flat["decoder/logits_bias"] = bias
    return unflatten({path: np.ascontiguousarray(value, np.float32) for path, value in flat.items()}, "weights")


@dataclasses.dataclass(frozen=True)
class ConvertedMarian:
    """A Marian model in jaxformer's terms."""

    config: TransformerConfig
    params: dict[str, Any]
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer
    order: np.ndarray  # [V]: the Marian id of each jaxformer id (vocabulary_order)
    source_language: str | None
    target_language: str | None


def _special_token(tokenizer_config: Mapping[str, Any], role: str, default: str) -> str:
    value = tokenizer_config.get(f"{role}_token", default)
    return value.get("content", default) if isinstance(value, Mapping) else str(value)


def convert_marian(files: MarianDirectory) -> ConvertedMarian:
    """The jaxformer model, parameters and tokenizers of a read MarianMT directory."""
    hf, vocab = files.config, files.vocab
    config = model_config_from_marian(hf)
    size = hf["vocab_size"]
    unk_piece = _special_token(files.tokenizer_config, "unk", "<unk>")
    if unk_piece not in vocab:
        raise ConversionError(f"vocab.json has no unknown token {unk_piece!r}")
    eos_id = hf.get("eos_token_id", 0)
    eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
    pad_id = hf.get("pad_token_id", size - 1)
    start_id = hf.get("decoder_start_token_id", pad_id)
    order = vocabulary_order(size, pad_id, eos_id, vocab[unk_piece], start_id)
    names = {index: piece for piece, index in vocab.items()}
    if max(names) >= size:
        raise ConversionError(f"vocab.json has ids up to {max(names)}, beyond config.json's vocab_size={size}")
    pieces = [names.get(int(index), f"<marian-unused-{index}>") for index in order]
    pieces[BOS_ID] = next(name for name in ("<s>", "<jaxformer-bos>", "<jaxformer-bos-3>") if name not in vocab)
    codes = [piece for piece in vocab if LANGUAGE_CODE.match(piece)]
    if codes:
        logging.warning(
            "the vocabulary has %d target-language tokens (e.g. %s): jaxformer's tokenizer does not produce "
            "them from text, so sentences must be translated without them (a multilingual model's target "
            "language cannot be chosen through jaxformer-translate)",
            len(codes),
            codes[0],
        )
    source = Tokenizer(side_model_proto(files.source_spm, pieces, "source.spm"))
    target = Tokenizer(side_model_proto(files.target_spm, pieces, "target.spm"))
    params = params_from_marian(hf, files.weights, config, order)
    languages = [files.tokenizer_config.get(key) for key in ("source_lang", "target_lang")]
    return ConvertedMarian(config, params, source, target, order, *languages)


def check_new_output(output: pathlib.Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConversionError(f"{output} already exists and is not an empty directory: choose a new --output")


def import_marian(
    directory: str | os.PathLike,
    workdir: str | os.PathLike,
    source_language: str | None = None,
    target_language: str | None = None,
) -> ConvertedMarian:
    """Writes the MarianMT model in `directory` as a jaxformer run in `workdir` (new or empty):
    one parameters-only checkpoint (step 0) with the metadata of a training run, and its two
    tokenizers. The languages default to tokenizer_config.json's source_lang / target_lang."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.run.directory import RunDirectory
    from jaxformer.run.metadata import CheckpointMetadata
    from jaxformer.training import experiment

    output = pathlib.Path(workdir)
    check_new_output(output)
    converted = convert_marian(read_marian_directory(directory))
    config = experiment.default_config()
    fields = {
        key: value
        for key, value in converted.config.to_dict().items()
        if key not in ("vocab_size", "source_vocab_size", "deterministic")
    }
    config.model = experiment.model_section("base", **fields)
    config.tokenizer.vocab_size = converted.config.vocab_size
    config.tokenizer.separate_vocabularies = True
    config.data.source_language = source_language or converted.source_language or config.data.source_language
    config.data.target_language = target_language or converted.target_language or config.data.target_language
    metadata = CheckpointMetadata(
        config=config.to_dict(),
        model=converted.config.to_dict(),
        tokenizer=converted.source_tokenizer.model_proto,
        target_tokenizer=converted.target_tokenizer.model_proto,
        data_fingerprint=None,
        step=0,
    )
    run = RunDirectory(output)
    output.mkdir(parents=True, exist_ok=True)
    checkpointer = Checkpointer(run.checkpoints, keep=None)
    try:
        checkpointer.save_params(0, converted.params, metadata)
    finally:
        checkpointer.close()
    converted.source_tokenizer.save(run.tokenizer_file)
    converted.target_tokenizer.save(run.target_tokenizer_file)
    return converted
