"""Reading a transformers MarianMT directory (see marian.py for the mapping as a whole).

Every small file is read and checked first, config.json completely, and the weights last: a
damaged or unsupported directory is refused in one line naming the file (and key) before a large
model's weights are loaded, and before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import sentencepiece as spm

from jaxformer.export import standalone
from jaxformer.export.safetensors import read_safetensors
from jaxformer.interop.marian_config import (  # noqa: F401 (ACTIVATIONS, the constants: marian.py's API)
    ACTIVATIONS,
    MARIAN_LAYER_NORM_EPSILON,
    MARIAN_POSITION_BASE,
    model_config_from_marian,
)
from jaxformer.interop.marian_generation import (
    check_generation_settings,
    recorded_search,
    renormalizes,
    search_flags,
    unbanned_tokens,
    unreproduced_sampling,
)
from jaxformer.interop.marian_layout import ConversionError, check_start_token_is_no_text, marian_weight_shapes


@dataclasses.dataclass(frozen=True)
class MarianDirectory:
    """What a transformers MarianMT directory holds."""

    config: dict[str, Any]  # config.json
    weights: dict[str, np.ndarray]  # by transformers name, float32
    vocab: dict[str, int]  # vocab.json
    source_spm: bytes
    target_spm: bytes
    tokenizer_config: dict[str, Any]  # tokenizer_config.json, {} without one
    renormalize_logits: bool = False  # generate()'s setting (marian_generation.renormalizes)
    search_flags: tuple[str, ...] = ()  # jaxformer-translate's flags for generate()'s default search
    search: dict[str, Any] = dataclasses.field(default_factory=dict)  # its `decoding` keys (recorded_search)
    unreproduced: tuple[str, ...] = ()  # a line for each of its settings they cannot reproduce


def _read_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConversionError(f"cannot read {path}: {error.strerror or error}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConversionError(f"{path} is not JSON: {error}") from error


def _read_object(path: pathlib.Path) -> dict[str, Any]:
    value = _read_json(path)
    if not isinstance(value, dict):
        raise ConversionError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def _read_spm(path: pathlib.Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConversionError(f"cannot read {path}: {error.strerror or error}") from error
    try:
        pieces = spm.SentencePieceProcessor(model_proto=data).get_piece_size()
    except RuntimeError:  # sentencepiece's parse failure, whose own text names no file
        pieces = None
    if not pieces:  # an empty file parses as a model without pieces
        raise ConversionError(f"{path} is not a sentencepiece model")
    return data


def _read_weights(directory: pathlib.Path) -> dict[str, np.ndarray]:
    if (directory / "model.safetensors").is_file():
        try:
            tensors = read_safetensors(directory / "model.safetensors")
        except standalone.ExportError as error:  # its message names the file and the damage
            raise ConversionError(str(error)) from error
    elif (directory / "pytorch_model.bin").is_file():
        path = directory / "pytorch_model.bin"
        try:
            import torch  # the interop extra
        except ImportError:
            raise ConversionError(
                f"{path}: reading a torch checkpoint needs torch: pip install 'jaxformer[interop]' (a "
                "model.safetensors is read without it)"
            ) from None

        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:  # torch's own text here is advice on weights_only=False
            raise ConversionError(
                f"{path} is not a readable torch state dict: damaged, or holding objects besides tensors"
            ) from error
        except (RuntimeError, EOFError, ValueError, OSError) as error:
            raise ConversionError(f"{path} is not a readable torch state dict: {error}".splitlines()[0]) from error
        if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
            raise ConversionError(f"{path} is not a state dict of tensors")
        tensors = {name: value.float().numpy() for name, value in state.items()}
    else:
        sharded = [
            name
            for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
            if (directory / name).is_file()
        ]
        if sharded:
            raise ConversionError(
                f"{directory / sharded[0]}: the weights are sharded, which jaxformer-convert does not read; save "
                "them whole (save_pretrained with a max_shard_size above the model's size)"
            )
        raise ConversionError(f"{directory} holds neither model.safetensors nor pytorch_model.bin")
    return {name: np.asarray(value, np.float32) for name, value in tensors.items()}


LAYER = re.compile(r"^model\.(encoder|decoder)\.layers\.(\d+)\.")


def check_marian_weights(
    hf: Mapping[str, Any], weights: Mapping[str, np.ndarray], where: str, config_where: str
) -> None:
    """`ConversionError` naming the tensor unless the weights (read from `where`) are what a
    MarianMTModel of config.json's values `hf` (from `config_where`) takes: each tensor of the
    shape config.json gives it (transformers refuses a size mismatch), none it has no place for
    (transformers drops those, "unexpected"), and every layer parameter there."""
    config = model_config_from_marian(hf, config_where)
    shapes = marian_weight_shapes(config, hf["vocab_size"], config.max_positions)
    if not hf.get("share_encoder_decoder_embeddings", True):
        del shapes["model.shared.weight"]  # the encoder and decoder embed_tokens are the modules' own
    for name, array in weights.items():
        if name not in shapes:
            layer = LAYER.match(name)
            if layer and int(layer[2]) >= hf[f"{layer[1]}_layers"]:
                key = f"{layer[1]}_layers"
                raise ConversionError(f"{where} holds {name}, a layer beyond {config_where}'s {key}={hf[key]}")
            raise ConversionError(f"{where} holds {name}, which a MarianMTModel of {config_where} has no place for")
        shape, keys = shapes[name]
        if tuple(array.shape) != shape:
            raise ConversionError(
                f"{where}: {name} has shape {tuple(array.shape)}, but {config_where}'s {keys} give {shape}"
            )
    missing = [name for name in shapes if LAYER.match(name) and name not in weights]
    if missing:
        raise ConversionError(f"{where} lacks {len(missing)} layer parameters of {config_where}, e.g. {missing[0]}")
    # A matrix nothing stands for under config.json's switches: transformers would initialize it randomly.
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        switch = "tie_word_embeddings" if name == "lm_head.weight" else "share_encoder_decoder_embeddings"
        if not hf.get(switch, True) and name not in weights:
            raise ConversionError(f"{config_where} has {switch}=false, but {where} has no {name}")


def _one_eos_id(value: Any, where: str) -> Any:
    """eos_token_id as one id. transformers stops at any id of a list; jaxformer's search ends
    sequences at its single EOS only, so a list of several cannot be decoded the same way."""
    if isinstance(value, list):
        if not value or any(other != value[0] for other in value):
            raise ConversionError(
                f"{where}: eos_token_id={value} names several end tokens; jaxformer's search stops at one only"
            )
        value = value[0]
    return value


# MarianConfig's pad_token_id and decoder_start_token_id, which transformers takes where config.json has none.
MARIAN_PAD_ID = 58100


def marian_token_ids(hf: Mapping[str, Any], generation: Mapping[str, Any], where: str) -> tuple[int, int, int]:
    """(pad, eos, decoder start) ids of config.json's values `hf` (from `where`) and
    generation_config.json's `generation` (what transformers' generate uses, {} without one)."""
    size = hf["vocab_size"]
    eos_id = _one_eos_id(hf.get("eos_token_id", 0), where)
    if "eos_token_id" in generation:
        generation_where = pathlib.Path(where).with_name("generation_config.json")
        generation_eos = _one_eos_id(generation["eos_token_id"], str(generation_where))
        if generation_eos != eos_id:
            raise ConversionError(
                f"{generation_where}: eos_token_id={generation['eos_token_id']} differs from "
                f"{where}'s {hf.get('eos_token_id', 0)}"
            )
    # transformers reads a config.json without pad_token_id as MarianConfig's default (OPUS-MT's
    # 58101-token models' last id), not as this model's last id: it cannot load a smaller model then.
    pad_id = hf.get("pad_token_id", MARIAN_PAD_ID)
    start_id = hf.get("decoder_start_token_id", pad_id)
    ids = {"eos_token_id": eos_id, "pad_token_id": pad_id, "decoder_start_token_id": start_id}
    for key, value in ids.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size):
            if key not in hf:  # eos_token_id's default, 0, is always one
                raise ConversionError(
                    f"{where} has no {key}, and MarianConfig's default {value}, which transformers takes, is not an "
                    f"id below vocab_size={size}"
                )
            raise ConversionError(f"{where}: {key}={value!r} is not an id below vocab_size={size}")
    if pad_id == eos_id:
        raise ConversionError(f"{where}: pad_token_id and eos_token_id are both {pad_id}; they must differ")
    # generate() starts from generation_config.json's decoder start token; jaxformer's BOS is config.json's.
    if generation.get("decoder_start_token_id") not in (None, start_id):
        raise ConversionError(
            f"{pathlib.Path(where).with_name('generation_config.json')}: decoder_start_token_id="
            f"{generation['decoder_start_token_id']!r} differs from {where}'s {start_id}"
        )
    return pad_id, eos_id, start_id


def _special_token(tokenizer_config: Mapping[str, Any], role: str, default: str) -> str:
    value = tokenizer_config.get(f"{role}_token", default)
    return value.get("content", default) if isinstance(value, Mapping) else str(value)


def marian_unk_id(vocab: Mapping[str, int], tokenizer_config: Mapping[str, Any], size: int, where: str) -> int:
    """The id of the unknown token (tokenizer_config.json's unk_token, "<unk>" by default) in
    `vocab` (vocab.json, read from `where`), whose ids must lie below config.json's vocab_size."""
    unk_piece = _special_token(tokenizer_config, "unk", "<unk>")
    if not vocab:
        raise ConversionError(f"{where} is empty")
    if unk_piece not in vocab:
        raise ConversionError(f"{where} has no unknown token {unk_piece!r}")
    if max(vocab.values()) >= size:
        raise ConversionError(f"{where} has ids up to {max(vocab.values())}, beyond config.json's vocab_size={size}")
    return vocab[unk_piece]


def read_marian_directory(directory: str | pathlib.Path) -> MarianDirectory:
    """The files of a transformers MarianMT directory; `ConversionError` naming a missing,
    damaged or unsupported one, config.json's values checked before the weights are read."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise ConversionError(f"{directory} is not a directory")
    for name in ("config.json", "vocab.json", "source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise ConversionError(f"{directory} has no {name}: not a transformers MarianMT directory")
    if (directory / "target_vocab.json").is_file():
        raise ConversionError(f"{directory} has a target_vocab.json: separate Marian vocabularies are not supported")
    config = _read_object(directory / "config.json")
    model_config_from_marian(config, str(directory / "config.json"))
    generation_path = directory / "generation_config.json"
    generation = _read_object(generation_path) if generation_path.is_file() else {}
    ids = marian_token_ids(config, generation, str(directory / "config.json"))
    # transformers reads generate()'s settings from generation_config.json, or config.json without one.
    settings, settings_path = (
        (generation, generation_path) if generation_path.is_file() else (config, directory / "config.json")
    )
    check_generation_settings(settings, *ids, str(settings_path))
    renormalize_logits = renormalizes(settings, str(settings_path))
    search = search_flags(settings, str(settings_path), config["vocab_size"])
    recorded = recorded_search(settings, str(settings_path))
    unreproduced = unreproduced_sampling(settings, str(settings_path)) + unbanned_tokens(
        settings, ids[0], ids[2], str(settings_path)
    )
    vocab = _read_object(directory / "vocab.json")
    if not all(isinstance(index, int) and not isinstance(index, bool) and index >= 0 for index in vocab.values()):
        raise ConversionError(f"{directory / 'vocab.json'} is not an object of pieces to non-negative integer ids")
    tokenizer_path = directory / "tokenizer_config.json"
    tokenizer_config = _read_object(tokenizer_path) if tokenizer_path.is_file() else {}
    if tokenizer_config.get("separate_vocabs"):  # a target_vocab.json is refused above; null or false: one vocabulary
        raise ConversionError(
            f"{tokenizer_path}: separate_vocabs={json.dumps(tokenizer_config['separate_vocabs'])} declares separate "
            f"Marian vocabularies, but {directory} has no target_vocab.json (MarianTokenizer cannot load it); "
            "jaxformer converts one shared vocab.json"
        )
    for key in ("source_lang", "target_lang"):  # the run's data languages, which are strings
        if not isinstance(tokenizer_config.get(key, ""), str):
            raise ConversionError(
                f"{tokenizer_path}: {key}={json.dumps(tokenizer_config[key])} is not a language code (a JSON string)"
            )
    unk_id = marian_unk_id(vocab, tokenizer_config, config["vocab_size"], str(directory / "vocab.json"))
    if unk_id in ids[:2]:
        raise ConversionError(
            f"{directory / 'vocab.json'}: the unknown token's id {unk_id} is config.json's pad or eos id; "
            "they must differ"
        )
    source_spm, target_spm = _read_spm(directory / "source.spm"), _read_spm(directory / "target.spm")
    spm_protos = {"source.spm": source_spm, "target.spm": target_spm}
    check_start_token_is_no_text(ids[2], vocab, spm_protos, str(directory / "config.json"))
    weights = _read_weights(directory)  # last: the expensive read, once everything else is known to be good
    weights_file = next(
        directory / name for name in ("model.safetensors", "pytorch_model.bin") if (directory / name).is_file()
    )
    check_marian_weights(config, weights, str(weights_file), str(directory / "config.json"))
    return MarianDirectory(
        config=config,
        vocab=vocab,
        source_spm=source_spm,
        target_spm=target_spm,
        tokenizer_config=tokenizer_config,
        weights=weights,
        renormalize_logits=renormalize_logits,
        search_flags=search,
        search=recorded,
        unreproduced=unreproduced,
    )
