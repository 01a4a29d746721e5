"""Hugging Face MarianMT models (the OPUS-MT translation models) to and from jaxformer runs.

`import_marian(directory, workdir)` reads a transformers MarianMT directory (config.json,
model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json; marian_files.py
checks and reads them) into a jaxformer run directory that `Translator.from_workdir`,
jaxformer-translate, jaxformer-evaluate, `training.init_from` and jaxformer-export read as they
read a trained run's.
`export_marian(workdir, directory)` (marian_export.py) writes a run's checkpoint in that format,
for `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained`.

Marian is the same post-norm encoder-decoder; what differs maps onto model options:

- the sinusoids: the sines of all frequencies, then the cosines (`position_layout="halves"`);
- a learned output bias, Marian's final_logits_bias (`logits_bias=True`);
- the activation ("swish" in many OPUS-MT models), LayerNorm epsilon 1e-5;
- the vocabulary: one vocab.json over both languages, with a source and a target sentencepiece
  model. jaxformer keeps its separate-vocabulary path (`share_embeddings=False`, the embeddings
  Marian's encoder and decoder embed_tokens: copies of its shared matrix unless the weights hold
  their own) with one sentencepiece model per side whose piece ids ARE the model's ids (pieces a
  side's .spm lacks are UNUSED there: never produced);
- ids: jaxformer's pad 0, eos 1, unk 2, bos 3 are Marian's pad, eos, unk and decoder start
  token, then every other token in Marian's order. jaxformer's decoder starts from BOS, so it
  starts from the vector Marian's starts from, and bans pad and BOS as Marian's generation config
  bans pad. Where the start token is pad, eos or unk (OPUS-MT's is pad), that token keeps its id
  and BOS is an extra row copying its embedding row and bias entry (vocab_size is Marian's + 1),
  its logit the start token's minus `BOS_LOGIT_OFFSET`, so that it takes no probability; a start
  token of its own (a jaxformer export's BOS) is BOS itself, so a run exported and imported again
  keeps its ids and parameters;
- the beam search's length penalty: `DecodeSettings(length_penalty="transformers")` is
  transformers' |Y|^alpha (the imported run's config says so: decoding.length_penalty, which a
  run fine-tuned from it validates and makes its final choice with);
- generate()'s renormalize_logits: `DecodeSettings(renormalize_after_bans=True)` scores each
  step over the tokens the search allows, as transformers then does (decoding.renormalize_after_bans
  in the run's config, carried as decoding.length_penalty is; marian_generation.py).

The other way, a jaxformer run keeps its ids (Marian's pad, eos and decoder start are then 0, 1
and 3, BOS's row its own); source and target embeddings that differ (an imported model
fine-tuned) are the encoder's and decoder's own embed_tokens (share_encoder_decoder_embeddings=
false), an untied output layer is lm_head (tie_word_embeddings=false); interleaved positions are
exported exactly by permuting the model width (every weight's "embed" axis) into the halves
layout. Pre-norm models have no Marian form.

torch and transformers (the `interop` extra) are imported only where a file format needs them:
reading pytorch_model.bin, and writing the transformers directory.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer.data.sentencepiece_proto import model_pb2
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.export.safetensors import unflatten
from jaxformer.interop import marian_output
from jaxformer.interop.marian_files import (  # noqa: F401 (ACTIVATIONS, the constants: this module's API too)
    ACTIVATIONS,
    MARIAN_LAYER_NORM_EPSILON,
    MARIAN_POSITION_BASE,
    MarianDirectory,
    marian_token_ids,
    marian_unk_id,
    model_config_from_marian,
    read_marian_directory,
)
from jaxformer.interop.marian_layout import (
    ConversionError,
    bos_is_copy,
    layer_names,
    to_jaxformer_layout,
    vocabulary_order,
)
from jaxformer.model.config import TransformerConfig
from jaxformer.model.position import sinusoidal_table
from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)

Piece = model_pb2.ModelProto.SentencePiece

# A copied BOS row repeats the decoder start token's (pad's) embedding; its logit is that token's minus
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
        logger.warning(
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


# -- converting ------------------------------------------------------------------------------


def _shared_embedding(weights: Mapping[str, np.ndarray]) -> np.ndarray:
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        if name in weights:
            return weights[name]
    if "lm_head.weight" in weights:
        return weights["lm_head.weight"]
    raise ConversionError("the weights hold no embedding (model.shared.weight)")


@dataclasses.dataclass(frozen=True)
class MarianEmbeddings:
    """The three vocabulary matrices MarianMTModel computes with, by Marian id. [V, D] each"""

    encoder: np.ndarray  # model.encoder.embed_tokens
    decoder: np.ndarray  # model.decoder.embed_tokens
    output: np.ndarray  # lm_head


def marian_embeddings(
    hf: Mapping[str, Any], weights: Mapping[str, np.ndarray], config: TransformerConfig
) -> MarianEmbeddings:
    """The matrices as transformers loads them: each module's own tensor where the weights hold
    one, else model.shared.weight, which tying gives it. transformers 5 keeps a saved embed_tokens
    or lm_head that differs from model.shared even under tie_word_embeddings=true, and saves all
    four separately under tie_word_embeddings=false; model.shared itself then computes nothing.
    Under share_encoder_decoder_embeddings=false there is no model.shared: the encoder and decoder
    have their own embed_tokens, and a tied lm_head is the decoder's."""
    tied = hf.get("tie_word_embeddings", True)
    found = {}
    for role, name in (
        ("encoder", "model.encoder.embed_tokens.weight"),
        ("decoder", "model.decoder.embed_tokens.weight"),
        ("output", "lm_head.weight"),
    ):
        # marian_files.check_marian_weights refused the weights that lack a matrix nothing stands for.
        if name in weights:
            found[role] = weights[name]
        elif not hf.get("share_encoder_decoder_embeddings", True):  # a tied lm_head: the decoder's
            found[role] = found["decoder"]
        else:
            if not tied:
                # transformers before 5 used model.shared here whatever the config said (the
                # module was shared); transformers 5 would initialize it randomly instead.
                logger.warning("the weights have no %s: using model.shared.weight, as transformers 4 did", name)
            found[role] = _shared_embedding(weights)
        if found[role].shape != (hf["vocab_size"], config.d_model):
            raise ConversionError(
                f"the weights' {name if name in weights else 'model.shared.weight'} has shape {found[role].shape}, "
                f"not ({hf['vocab_size']}, {config.d_model})"
            )
    return MarianEmbeddings(**found)


def output_is_tied(hf: Mapping[str, Any], embeddings: MarianEmbeddings) -> bool:
    """Whether jaxformer's output layer can be its target embedding: lm_head equal to the decoder's
    embedding and, as jaxformer scales embeddings by sqrt(d_model), Marian's scale_embedding on
    (without it the stored embedding is divided by that scale, and lm_head is not)."""
    return bool(hf.get("scale_embedding", False)) and np.array_equal(embeddings.output, embeddings.decoder)


def params_from_marian(
    hf: Mapping[str, Any],
    weights: Mapping[str, np.ndarray],
    config: TransformerConfig,
    order: np.ndarray,
    embeddings: MarianEmbeddings | None = None,
) -> dict[str, Any]:
    """jaxformer parameters (separate vocabularies) of Marian weights; `order` from
    `vocabulary_order`; `embeddings` defaults to `marian_embeddings`, config.tie_output_embedding
    must be `output_is_tied`'s."""
    missing = [name for _, name, _ in layer_names(config) if name not in weights]
    if missing:
        raise ConversionError(f"the weights lack {len(missing)} layer parameters, e.g. {missing[0]}")
    flat = {
        path: to_jaxformer_layout(kind, weights[name], config.num_heads) for path, name, kind in layer_names(config)
    }
    for stack in ("encoder", "decoder"):
        name = f"model.{stack}.embed_positions.weight"
        if name in weights:
            _check_sinusoids(name, weights[name], config)
    embeddings = embeddings or marian_embeddings(hf, weights, config)
    if config.tie_output_embedding != output_is_tied(hf, embeddings):
        raise ConversionError(
            f"tie_output_embedding={config.tie_output_embedding} does not fit the weights' lm_head and "
            "decoder embedding"
        )
    scale = np.float32(1.0 if hf.get("scale_embedding", False) else math.sqrt(config.d_model))
    flat["source_embedding/embedding"] = embeddings.encoder[order] / scale
    flat["target_embedding/embedding"] = embeddings.decoder[order] / scale
    if not config.tie_output_embedding:
        flat["decoder/logits_kernel"] = embeddings.output[order].T
    bias = weights.get("final_logits_bias", np.zeros((1, hf["vocab_size"]), np.float32)).reshape(-1)[order]
    if bos_is_copy(order):  # a second row of pad's (or eos's, unk's): it must take none of its probability
        bias[BOS_ID] -= BOS_LOGIT_OFFSET
    flat["decoder/logits_bias"] = bias
    return unflatten({path: np.ascontiguousarray(value, np.float32) for path, value in flat.items()}, "weights")


# How far saved float32 sinusoids may lie from the computed ones: transformers' and jaxformer's
# tables agree within 5e-10 (measured up to 1024 positions by 1024).
SINUSOID_TOLERANCE = 1e-6


def _check_sinusoids(name: str, table: np.ndarray, config: TransformerConfig) -> None:
    """A ConversionError unless `table` is the sinusoids jaxformer computes (transformers 4 saved
    them; transformers 5 loads the file's values, so learned or edited ones would be dropped here):
    in float32, or a float16 or bfloat16 copy (an edit within 5e-3 was taken for one)."""
    import jax.numpy as jnp  # its bfloat16, ml_dtypes', is numpy's too

    expected = sinusoidal_table(table.shape[0], config.d_model, config.position_base, config.position_layout)
    table = np.asarray(table, np.float32)
    difference = float(np.max(np.abs(table - expected))) if table.size else 0.0
    if difference > SINUSOID_TOLERANCE and not any(_is_copy(table, expected, d) for d in (np.float16, jnp.bfloat16)):
        raise ConversionError(
            f"{name} is not the sinusoids transformers computes (they differ by up to {difference:.3g}; not a "
            "float16 or bfloat16 copy of them either): jaxformer computes its positions, so learned or edited "
            "ones cannot be imported"
        )


def _is_copy(table: np.ndarray, expected: np.ndarray, dtype: Any) -> bool:
    """Whether every value of `table` is one of `dtype`'s and within one of its steps of `expected`'s
    (a step, not half of one: a rounding may fall the other way where the two computations differ)."""
    if not np.array_equal(table.astype(dtype).astype(np.float32), table):
        return False
    steps = np.abs(np.spacing(expected.astype(dtype)).astype(np.float32))
    return bool(np.all(np.abs(table - expected) <= steps))


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
    renormalize_after_bans: bool  # transformers' generate renormalizes its scores (renormalize_logits)
    search_flags: tuple[str, ...] = ()  # jaxformer-translate's flags for generate()'s default search
    search: dict[str, Any] = dataclasses.field(default_factory=dict)  # its `decoding` keys, for --to_hf
    unreproduced: tuple[str, ...] = ()  # a line for each of its settings they cannot reproduce


def convert_marian(files: MarianDirectory) -> ConvertedMarian:
    """The jaxformer model, parameters and tokenizers of a read MarianMT directory."""
    hf, vocab = files.config, files.vocab
    size = hf["vocab_size"]
    pad_id, eos_id, start_id = marian_token_ids(hf, {}, "config.json")
    unk_id = marian_unk_id(vocab, files.tokenizer_config, size, "vocab.json")
    order = vocabulary_order(size, pad_id, eos_id, unk_id, start_id)
    config = model_config_from_marian(hf, vocab_size=len(order))
    names = {index: piece for piece, index in vocab.items()}
    pieces = [names.get(int(index), f"<marian-unused-{index}>") for index in order]
    if bos_is_copy(order):  # the copy's piece: a name of its own
        pieces[BOS_ID] = next(name for name in ("<s>", "<jaxformer-bos>", "<jaxformer-bos-3>") if name not in vocab)
    codes = [piece for piece in vocab if LANGUAGE_CODE.match(piece)]
    if codes:
        logger.warning(
            "the vocabulary has %d target-language tokens (e.g. %s): jaxformer's tokenizer does not produce "
            "them from text, so sentences must be translated without them (a multilingual model's target "
            "language cannot be chosen through jaxformer-translate)",
            len(codes),
            codes[0],
        )
    source = Tokenizer(side_model_proto(files.source_spm, pieces, "source.spm"))
    target = Tokenizer(side_model_proto(files.target_spm, pieces, "target.spm"))
    embeddings = marian_embeddings(hf, files.weights, config)
    config = dataclasses.replace(config, tie_output_embedding=output_is_tied(hf, embeddings))
    params = params_from_marian(hf, files.weights, config, order, embeddings)
    languages = [files.tokenizer_config.get(key) for key in ("source_lang", "target_lang")]
    return ConvertedMarian(
        config,
        params,
        source,
        target,
        order,
        *languages,
        files.renormalize_logits,
        files.search_flags,
        files.search,
        files.unreproduced,
    )


def import_marian(
    directory: str | os.PathLike,
    workdir: str | os.PathLike,
    source_language: str | None = None,
    target_language: str | None = None,
    on_placed: Callable[[], None] | None = None,
) -> ConvertedMarian:
    """Writes the MarianMT model in `directory` as a jaxformer run in `workdir` (new or empty):
    one parameters-only checkpoint (step 0) with the metadata of a training run, and its two
    tokenizers, written whole or not at all (marian_output.py; `on_placed()` once in place). The
    languages default to tokenizer_config.json's source_lang / target_lang."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.run.directory import RunDirectory
    from jaxformer.run.metadata import CheckpointMetadata
    from jaxformer.training import experiment
    from jaxformer.training.config_rules import preset_of_sizes

    output = marian_output.check_new_output(workdir, marian_output.RUN)
    converted = convert_marian(read_marian_directory(directory))
    config = experiment.default_config()
    fields = {
        key: value
        for key, value in converted.config.to_dict().items()
        if key not in ("vocab_size", "source_vocab_size", "deterministic")
    }
    # Labelled as the preset whose sizes it has, if any: base's name on tiny's sizes is a config
    # a run refuses (config_rules.preset_held_instead).
    config.model = experiment.model_section(preset_of_sizes(fields) or "base", **fields)
    config.tokenizer.vocab_size = converted.config.vocab_size
    config.tokenizer.separate_vocabularies = True
    config.data.source_language = source_language or converted.source_language or config.data.source_language
    config.data.target_language = target_language or converted.target_language or config.data.target_language
    # The form transformers' beam search scores with: a run fine-tuned from this one validates,
    # keeps best/ and makes its final choice with it (run_start.settle_inherited_decoding).
    config.decoding.length_penalty = "transformers"
    config.decoding.renormalize_after_bans = converted.renormalize_after_bans
    # generate()'s default search, which --to_hf writes back; the commands' flags choose theirs.
    config.decoding.update(converted.search)
    metadata = CheckpointMetadata(
        config=config.to_dict(),
        model=converted.config.to_dict(),
        tokenizer=converted.source_tokenizer.model_proto,
        target_tokenizer=converted.target_tokenizer.model_proto,
        data_fingerprint=None,
        step=0,
    )
    with marian_output.written_whole(output, marian_output.RUN, on_placed) as staging:
        run = RunDirectory(staging)
        checkpointer = Checkpointer(run.checkpoints, keep=None)
        try:
            checkpointer.save_params(0, converted.params, metadata)
        finally:
            checkpointer.close()
        converted.source_tokenizer.save(run.tokenizer_file)
        converted.target_tokenizer.save(run.target_tokenizer_file)
    return converted
