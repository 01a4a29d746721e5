"""How MarianMT's parameters and vocabulary lie against jaxformer's: the parameter names, the
array layouts, and the id order (see marian.py for the mapping as a whole)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import sentencepiece as spm

from jaxformer.errors import UserError
from jaxformer.model.config import TransformerConfig
from jaxformer.tokens import BOS_ID


class ConversionError(UserError, ValueError):
    """A model or directory that cannot be converted; the message names the file or option."""


# -- parameter names -------------------------------------------------------------------------
# Each entry: (jaxformer path "a/b/c", transformers name, how the array is laid out). Kinds:
#   heads_in   a Q/K/V projection: torch [N*H, D]      <-> jaxformer kernel [D, N, H]
#   heads_bias its bias:            torch [N*H]         <-> [N, H]
#   heads_out  the output projection: torch [D, N*H]    <-> [N, H, D]
#   dense      a feed-forward kernel: torch [out, in]   <-> [in, out]
#   vector     biases and LayerNorm scales, as they are


def _layer_names(stack: str, index: int) -> list[tuple[str, str, str]]:
    ours, theirs = f"{stack}/layer_{index}/", f"model.{stack}.layers.{index}."
    attentions = [("self_attention", "self_attn")]
    norms = [("self_attention_norm", "self_attn_layer_norm"), ("feed_forward_norm", "final_layer_norm")]
    if stack == "decoder":
        attentions.append(("cross_attention", "encoder_attn"))
        norms.append(("cross_attention_norm", "encoder_attn_layer_norm"))
    names = []
    for our_attention, their_attention in attentions:
        for projection, torch_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            prefix = f"{theirs}{their_attention}.{torch_name}."
            names.append((f"{ours}{our_attention}/{projection}_kernel", prefix + "weight", "heads_in"))
            names.append((f"{ours}{our_attention}/{projection}_bias", prefix + "bias", "heads_bias"))
        names.append((f"{ours}{our_attention}/out_kernel", f"{theirs}{their_attention}.out_proj.weight", "heads_out"))
        names.append((f"{ours}{our_attention}/out_bias", f"{theirs}{their_attention}.out_proj.bias", "vector"))
    for our_norm, their_norm in norms:
        names.append((f"{ours}{our_norm}/scale", f"{theirs}{their_norm}.weight", "vector"))
        names.append((f"{ours}{our_norm}/bias", f"{theirs}{their_norm}.bias", "vector"))
    for ours_ffn, theirs_ffn in (("wi", "fc1"), ("wo", "fc2")):
        names.append((f"{ours}feed_forward/{ours_ffn}_kernel", f"{theirs}{theirs_ffn}.weight", "dense"))
        names.append((f"{ours}feed_forward/{ours_ffn}_bias", f"{theirs}{theirs_ffn}.bias", "vector"))
    return names


def layer_names(config: TransformerConfig) -> list[tuple[str, str, str]]:
    """(jaxformer path, transformers name, kind) of every encoder and decoder layer parameter."""
    names = []
    for stack, count in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        for index in range(count):
            names += _layer_names(stack, index)
    return names


def marian_weight_shapes(
    config: TransformerConfig, size: int, max_positions: int
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor that a MarianMTModel of `config`'s widths and layers (vocab_size `size`, Marian's
    own, and max_position_embeddings `max_positions`) takes, by transformers name: its shape, and
    the MarianConfig values giving it."""
    d_model, d_ff = config.d_model, config.d_ff
    width = f"d_model={d_model}"
    embedding = (size, d_model), f"vocab_size={size}, {width}"
    shapes = {
        name: embedding
        for name in (
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        )
    }
    shapes["final_logits_bias"] = (1, size), f"vocab_size={size}"
    for stack in ("encoder", "decoder"):
        # The sinusoids, which transformers 4 saved; jaxformer computes them, as transformers does.
        positions = (max_positions, d_model), f"max_position_embeddings={max_positions}, {width}"
        shapes[f"model.{stack}.embed_positions.weight"] = positions
    for _, name, kind in layer_names(config):
        ffn = f"{name.split('.')[1]}_ffn_dim={d_ff}, {width}"
        if ".fc1." in name:
            shapes[name] = ((d_ff, d_model) if name.endswith("weight") else (d_ff,)), ffn
        elif name.endswith("fc2.weight"):
            shapes[name] = (d_model, d_ff), ffn
        else:
            shapes[name] = ((d_model, d_model) if kind in ("heads_in", "heads_out") else (d_model,)), width
    return shapes


def to_jaxformer_layout(kind: str, array: np.ndarray, num_heads: int) -> np.ndarray:
    """A transformers (torch) parameter in jaxformer's layout (see the kinds above)."""
    array = np.asarray(array, np.float32)
    if kind == "heads_in":
        return array.T.reshape(array.shape[1], num_heads, -1)
    if kind == "heads_bias":
        return array.reshape(num_heads, -1)
    if kind == "heads_out":
        return array.T.reshape(num_heads, -1, array.shape[0])
    if kind == "dense":
        return array.T
    return array


def to_marian_layout(kind: str, array: np.ndarray) -> np.ndarray:
    """The inverse of `to_jaxformer_layout`."""
    array = np.asarray(array, np.float32)
    if kind == "heads_in":
        return array.reshape(array.shape[0], -1).T
    if kind == "heads_bias":
        return array.reshape(-1)
    if kind == "heads_out":
        return array.reshape(-1, array.shape[-1]).T
    if kind == "dense":
        return array.T
    return array


# -- the vocabulary --------------------------------------------------------------------------


def vocabulary_order(size: int, pad_id: int, eos_id: int, unk_id: int, start_id: int) -> np.ndarray:
    """For each jaxformer id, the Marian id whose row it takes: pad, eos, unk, the decoder start
    token (jaxformer's BOS), then every other Marian id in order. A start token that is pad, eos or
    unk (OPUS-MT's is pad) keeps its own id among those, and BOS is a copy of its row [size + 1];
    one of its own (jaxformer's exports' BOS) is BOS itself [size]."""
    specials = (pad_id, eos_id, unk_id)
    if len(set(specials)) != 3:
        raise ConversionError(f"Marian's pad, eos and unk ids must differ, got {specials}")
    others = [index for index in range(size) if index not in (*specials, start_id)]
    return np.asarray([pad_id, eos_id, unk_id, start_id, *others], np.int64)


def check_start_token_is_no_text(
    start_id: int, vocab: Mapping[str, int], spm_protos: Mapping[str, bytes], where: str
) -> None:
    """`ConversionError` where the decoder start token (jaxformer's BOS, which its tokenizers never
    produce) is a piece that a side's sentencepiece model (`spm_protos`, by file name) produces from
    text: MarianTokenizer gives that id for it, jaxformer's tokenizer could not, so the same text
    would be other ids. Pad, eos and unk are no such piece (BOS is then a copy of their row)."""
    piece = next((name for name, index in vocab.items() if index == start_id), None)
    for name, proto in spm_protos.items():
        processor = spm.SentencePieceProcessor(model_proto=proto)
        index = processor.piece_to_id(piece) if piece is not None else processor.unk_id()
        text = not (processor.is_unknown(index) or processor.is_control(index) or processor.is_unused(index))
        if text:
            raise ConversionError(
                f"{where}: decoder_start_token_id={start_id} is {piece!r}, a piece {name} produces from text; "
                "jaxformer's decoder start (BOS) is a token of no text, so it cannot convert this model"
            )


def bos_is_copy(order: np.ndarray) -> bool:
    """Whether jaxformer's BOS in `order` (vocabulary_order's) repeats a row that pad, eos or unk has."""
    return int(order[BOS_ID]) in order[:BOS_ID]


def marian_to_jaxformer_ids(order: np.ndarray) -> np.ndarray:
    """For each Marian id, its jaxformer id (the inverse of `vocabulary_order`, BOS's copy aside)."""
    ids = np.empty(len(order) - bos_is_copy(order), np.int64)
    ids[order[BOS_ID:]] = np.arange(BOS_ID, len(order))
    ids[order[:BOS_ID]] = np.arange(BOS_ID)  # after BOS: where BOS is a copy, the token's own id
    return ids
