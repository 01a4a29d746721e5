"""An export's files read and checked, with numpy, sentencepiece and jax alone: config.json, the
safetensors parameters, the sentencepiece models and the serialized program, each against
config.json's SHA-256 (export_program.py checks the parameters and settings against the program).

serve.py (jaxformer/export/standalone.py) imports this module; `jaxformer-export` copies it beside
serve.py, so it imports no jaxformer module in an export: there serve.py gives it the names below
that it takes from standalone.py before running it.

The parameters file is safetensors, read here with numpy alone: an 8-byte little-endian header
length, a JSON header {name: {dtype, shape, data_offsets}} and the raw little-endian bytes.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import pathlib
import struct
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

if __package__:  # jaxformer.export.export_files; an export's copy is given these by serve.py (`_import_beside`)
    from jaxformer.export.standalone import CONFIG_FILE, FORMAT, FORMAT_VERSION, LOADER_FILE, ExportError


# safetensors dtype names; the data is stored little-endian.
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(jnp.bfloat16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "F32": np.dtype(np.float32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F64": np.dtype(np.float64),
}


# The integers of config.json the loader uses, with their least values. model.source_vocab_size may
# be null (one shared vocabulary), and model.max_positions (no last position; absent in an export
# written before it was read); a sentence is cut every max_source_tokens - 1 tokens.
_CONFIG_INTEGERS = {
    "special_tokens": {"pad": 0, "eos": 0, "bos": 0},
    "model": {"vocab_size": 1, "source_vocab_size": 1, "max_positions": 2},
    "serving": {"batch_size": 1, "length_bucket": 1, "max_source_tokens": 2, "max_source_length": 1},
}
# decoding.method, the program's search (every export before greedy search and sampling could be
# exported records "beam"), and the integers of "decoding" that its search reads; a sampling
# export's seed is a key's (jaxformer.decoding.generate.MAX_SEED, which an export cannot import).
SEARCH_INTEGERS = {
    "beam": {"beam_size": 1, "max_extra_length": 0},
    "greedy": {"max_extra_length": 0},
    "sample": {"max_extra_length": 0, "top_k": 0, "seed": 0},
}
MAX_SEED = 2**32 - 1
# The keys config.json holds, by section ("": its top level): those the loader reads and those the
# exporter writes to describe the export, in every export written. Any other is refused: an added
# "beam_size" or a misspelled "max_source_tokenz" would seem to take effect, and the loader would
# never read it. "model" is TransformerConfig.to_dict()'s, "decoding" a beam search's every
# DecodeSettings field and another search's those it reads: twins of jaxformer's, which an export
# cannot import (tests/export/test_export_config_keys.py holds them alike).
CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "": (
        *("format", "format_version", "model", "decoding", "special_tokens", "serving", "checkpoint"),
        *("platforms", "platforms_failed", "program", "files"),
    ),
    "model": (
        *("architecture", "vocab_size", "source_vocab_size", "d_model", "num_heads", "d_ff"),
        *("num_encoder_layers", "num_decoder_layers", "max_positions", "position_layout", "position_base"),
        *("normalization", "activation", "layer_norm_epsilon", "logits_bias", "share_embeddings"),
        *("tie_output_embedding", "dropout_rate", "attention_dropout_rate", "activation_dropout_rate"),
        *("source_word_dropout_rate", "target_word_dropout_rate", "deterministic", "dtype", "param_dtype"),
        *("matmul_dtype", "attention_implementation", "remat_policy", "scan_layers"),
    ),
    "special_tokens": ("pad", "eos", "unk", "bos"),
    "serving": ("batch_size", "length_bucket", "max_source_tokens", "max_source_length"),
    "checkpoint": ("workdir", "which", "step", "bleu", "averaged_steps"),
    "program": ("inputs", "outputs", "key_impl", "jax_version", "calling_convention_version"),
    "files": ("parameters", "tokenizer", "target_tokenizer", "program", "loader"),
}
DECODING_KEYS: dict[str, tuple[str, ...]] = {  # by decoding.method
    "beam": (
        *("method", "beam_size", "alpha", "length_penalty", "max_extra_length", "stop", "temperature", "top_k"),
        "renormalize_after_bans",
    ),
    "greedy": ("method", "max_extra_length", "renormalize_after_bans"),
    "sample": ("method", "max_extra_length", "renormalize_after_bans", "temperature", "top_k", "seed"),
}
# A sampling export's temperature, which its program divides float32 logits by: one float32 cannot
# hold (1e39) is inf there, and every token is drawn alike. The twin of
# jaxformer.decoding.generate.TEMPERATURE_RULE and is_valid_temperature, which an export cannot import
# (tests/export/test_export_methods.py holds them alike).
TEMPERATURE_RULE = f"a finite number > 0 that float32 holds (at most {float(np.finfo(np.float32).max):.8g})"


def is_valid_temperature(value: Any) -> bool:
    """Whether the number `value` is a temperature TEMPERATURE_RULE allows (NaN not)."""
    try:
        with np.errstate(over="ignore"):  # the cast that overflows is the question, not a warning
            return bool(value > 0 and np.isfinite(np.float32(value)))
    except OverflowError:  # an integer beyond every float (10**400, which JSON can hold)
        return False


# -- the files -------------------------------------------------------------------------------


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file by name, in their stored dtypes."""
    return parse_safetensors(read_bytes(pathlib.Path(path)), path)


def parse_safetensors(data: bytes, where: str | pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of the safetensors file `where` whose bytes are `data`."""

    def damaged(problem: str) -> ExportError:
        return ExportError(f"{where} is not a readable safetensors file: {problem}")

    if len(data) < 8:
        raise damaged(f"it has {len(data)} bytes, fewer than the 8 of its header length")
    (header_length,) = struct.unpack("<Q", data[:8])
    if header_length > len(data) - 8:
        raise damaged(f"its header length {header_length} exceeds the {len(data) - 8} bytes that follow")
    try:
        header = json.loads(data[8 : 8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise damaged(f"its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    buffer = memoryview(data)[8 + header_length :]
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = SAFETENSORS_DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise damaged(f"tensor {name!r} has no known dtype, shape or data_offsets") from None
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in [*shape, begin, end]):
            raise damaged(f"tensor {name!r} has a shape or offsets that are not non-negative integers")
        if not begin <= end <= len(buffer) or end - begin != math.prod(shape) * dtype.itemsize:
            raise damaged(f"tensor {name!r} has data_offsets {[begin, end]} that do not fit its shape {shape}")
        raw = np.frombuffer(buffer[begin:end], dtype=f"<u{dtype.itemsize}")  # any dtype, byte order fixed
        tensors[name] = raw.astype(f"=u{dtype.itemsize}").view(dtype).reshape(shape)
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise damaged(f"its tensors leave a gap or overlap at byte {position} of the data")
        position = end
    if position != len(buffer):
        raise damaged(f"its tensors cover {position} of the {len(buffer)} data bytes")
    return tensors


def unflatten(tensors: dict[str, np.ndarray], where: str | pathlib.Path) -> dict[str, Any]:
    """Nested dicts from names "a/b/c"."""
    tree: dict[str, Any] = {}
    for name, array in tensors.items():
        *parents, leaf = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ExportError(f"{where}: tensor {name!r} lies below another tensor")
        if leaf in node:
            raise ExportError(f"{where}: tensor {name!r} is also a prefix of other names")
        node[leaf] = array
    return tree


def read_config(directory: str | pathlib.Path) -> dict[str, Any]:
    """config.json of an export, checked for the format and version this loader reads."""
    if directory == "":  # pathlib.Path("") is ".": the current folder, read by accident
        raise ExportError(
            f"the export's folder is given as '' (an empty path): give the folder that holds {CONFIG_FILE}"
        )
    directory = pathlib.Path(directory)
    if directory.is_file():  # config.json or serve.py named for the export's folder
        raise ExportError(f"{directory} is a file, not an export's folder: give the folder that holds {CONFIG_FILE}")
    if not directory.is_dir():
        raise ExportError(f"{directory}: no such directory")
    path = directory / CONFIG_FILE
    if not os.path.lexists(path) and not os.path.lexists(directory / LOADER_FILE):
        # Without serve.py beside it either, no export was ever here; with it, one lost its config.
        raise ExportError(f"{directory} is not a jaxformer export (no {CONFIG_FILE} in it)")
    try:
        config = json.loads(read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path} is damaged: not valid JSON ({error})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f'{path} is not the config of a jaxformer export (no "format": "{FORMAT}")')
    version = config.get("format_version")
    if isinstance(version, bool) or version not in range(1, FORMAT_VERSION + 1):
        raise ExportError(
            f"{path} has export format version {version!r}; this loader reads versions 1 to {FORMAT_VERSION}"
        )
    decoding = config.get("decoding") if isinstance(config.get("decoding"), dict) else {}
    method = decoding.get("method")
    if not isinstance(method, str) or method not in SEARCH_INTEGERS:
        raise ExportError(f"{path}: decoding.method is {method!r}; it must be one of {', '.join(SEARCH_INTEGERS)}")
    if version == 1 and method != "beam":
        raise ExportError(
            f"{path}: decoding.method is {method!r} in export format version 1, which holds beam search alone"
        )
    _refuse_unknown_keys(path, config, method)
    for section, keys in {**_CONFIG_INTEGERS, "decoding": SEARCH_INTEGERS[method]}.items():
        for key, least in keys.items():
            value = config[section].get(key) if isinstance(config.get(section), dict) else None
            if (value is not None or key not in ("source_vocab_size", "max_positions")) and (
                not isinstance(value, int) or isinstance(value, bool) or value < least
            ):
                raise ExportError(f"{path}: {section}.{key} is {value!r}; it must be an integer >= {least}")
    if method == "sample":
        _check_sampling(path, config)
    serving = config["serving"]
    longest = serving["length_bucket"] * math.ceil(serving["max_source_tokens"] / serving["length_bucket"])
    if longest > serving["max_source_length"]:
        raise ExportError(
            f"{path}: serving.max_source_tokens {serving['max_source_tokens']} makes rows of {longest} tokens "
            f"(a multiple of length_bucket {serving['length_bucket']}), over max_source_length "
            f"{serving['max_source_length']}"
        )
    positions = config["model"].get("max_positions")
    if positions is not None and serving["max_source_tokens"] > positions:  # rows the model has no positions for
        raise ExportError(
            f"{path}: serving.max_source_tokens {serving['max_source_tokens']} is more than the model's "
            f"{positions} positions (model.max_positions); it must be at most {positions}"
        )
    _check_file_entries(path, config.get("files"))
    return config


def _refuse_unknown_keys(path: pathlib.Path, config: dict[str, Any], method: str) -> None:
    """The first key of config.json, at its top or in a section, that is not CONFIG_KEYS' (for
    "decoding", DECODING_KEYS' of the export's `method`), named with its near matches in its section
    or else the keys the section takes; a section that is no object is left to the checks of its values."""
    sections = {"": config} | {name: config.get(name) for name in CONFIG_KEYS if name}
    for name, section in (sections | {"decoding": config["decoding"]}).items():
        keys = DECODING_KEYS[method] if name == "decoding" else CONFIG_KEYS[name]
        for key in section if isinstance(section, dict) else ():
            if key not in keys:
                prefix = f"{name}." if name else ""
                near = [prefix + match for match in difflib.get_close_matches(key, keys, n=3, cutoff=0.6)]
                scope = {"": "config.json", "decoding": f"a {method} export's decoding"}.get(name, name)
                hint = f"did you mean {', '.join(near)}?" if near else f"{scope} takes {', '.join(keys)}"
                raise ExportError(f"{path}: unknown key {prefix + key!r}, which this loader does not read; {hint}")


def _check_sampling(path: pathlib.Path, config: dict[str, Any]) -> None:
    """A sampling export's seed (a key's, at most MAX_SEED), temperature and key implementation."""
    seed, temperature = config["decoding"]["seed"], config["decoding"].get("temperature")
    if seed > MAX_SEED:
        raise ExportError(f"{path}: decoding.seed is {seed}; it must be at most {MAX_SEED}")
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not is_valid_temperature(temperature)
    ):
        raise ExportError(f"{path}: decoding.temperature is {temperature!r}; it must be {TEMPERATURE_RULE}")
    impl = config.get("program", {}).get("key_impl") if isinstance(config.get("program"), dict) else None
    if not isinstance(impl, str):
        raise ExportError(f"{path}: program.key_impl is {impl!r}, not the name of a jax random key implementation")


def _check_file_entries(path: pathlib.Path, files: Any) -> None:
    """config.json's "files": each a {"name": a file of the directory, "sha256": its digest}. Older
    exports list the loader's helpers by name alone and give no digest for serve.py: those are
    checked for presence only (check_loader_files)."""
    loader = files.get("loader") if isinstance(files, dict) else None
    imports = loader.get("imports", []) if isinstance(loader, dict) else None
    if not isinstance(imports, list):
        raise ExportError(f"{path}: files.loader is {loader!r}, not serve.py's name, SHA-256 and imports")
    entries = [(role, files.get(role), True) for role in ("parameters", "tokenizer", "program")]
    entries += [("target_tokenizer", files["target_tokenizer"], True)] if "target_tokenizer" in files else []
    entries += [("loader", loader, False)]
    entries += [("loader.imports", entry if isinstance(entry, dict) else {"name": entry}, False) for entry in imports]
    for key, entry, digest_needed in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        digest = entry.get("sha256", None if digest_needed else "") if isinstance(entry, dict) else None
        if name in ("", "..") or not isinstance(name, str) or pathlib.PurePath(name).name != name:
            digest = None
        if not isinstance(digest, str):
            raise ExportError(f"{path}: files.{key} is {entry!r}, not a file of the directory and its SHA-256")


def read_verified(directory: pathlib.Path, config: dict[str, Any], role: str) -> tuple[pathlib.Path, bytes]:
    """(path, bytes) of config.json's file `role`, whose SHA-256 must be config.json's."""
    entry = config["files"][role]  # a name and a digest (read_config)
    path = directory / entry["name"]
    data = read_bytes(path)
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ExportError(f"{path} is damaged: its SHA-256 differs from the one in {directory / CONFIG_FILE}")
    return path, data


def check_loader_files(directory: pathlib.Path, config: dict[str, Any]) -> None:
    """serve.py and the helpers it imports are there, each with config.json's SHA-256 (exports
    written before the loader's checksums were recorded name the helpers only: their presence
    is checked)."""
    loader = config["files"]["loader"]  # its entries checked by read_config
    entries = [loader] + [entry if isinstance(entry, dict) else {"name": entry} for entry in loader.get("imports", [])]
    for entry in entries:
        name = entry["name"]
        data = read_bytes(directory / name)
        if "sha256" in entry and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ExportError(
                f"{directory / name} is damaged or edited: its SHA-256 differs from the one in "
                f"{directory / CONFIG_FILE}"
            )


def read_tokenizer(directory: pathlib.Path, config: dict[str, Any], role: str, size_key: str) -> Tokenizer:
    """The tokenizer file `role`, whose piece count must be config.json's model.`size_key`."""
    path, data = read_verified(directory, config, role)
    tokenizer = Tokenizer(data, path, config["special_tokens"])
    if tokenizer.vocab_size != config["model"][size_key]:
        raise ExportError(
            f"{path} has {tokenizer.vocab_size} pieces, but {directory / CONFIG_FILE} gives the model "
            f"model.{size_key}={config['model'][size_key]}"
        )
    return tokenizer


def parse_program(data: bytes, where: pathlib.Path) -> jax.export.Exported:
    """The deserialized jax.export program."""
    try:
        import flatbuffers  # noqa: F401  (what jax's deserializer needs)
    except ImportError:
        raise ExportError(f"reading {where} needs the flatbuffers package: pip install flatbuffers") from None
    try:
        program = jax.export.deserialize(bytearray(data))
    except Exception as error:  # noqa: BLE001  (a damaged flatbuffer fails in arbitrary ways)
        raise ExportError(f"{where} is damaged: jax.export cannot deserialize it ({type(error).__name__})") from None
    return program


def read_bytes(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file; the export is incomplete") from None
    except OSError as error:
        raise ExportError(f"cannot read {path}: {error.strerror or error}") from None


# -- the tokenizer ---------------------------------------------------------------------------


class Tokenizer:
    """A sentencepiece model: text <-> int32 ids, EOS appended, decoding up to the first EOS."""

    def __init__(self, model_proto: bytes, where: str | pathlib.Path, special_tokens: dict[str, int]):
        try:
            self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError:  # sentencepiece's only report of a model it cannot parse
            raise ExportError(f"{where} is damaged: sentencepiece cannot parse it") from None
        self.pad_id, self.eos_id, self.bos_id = special_tokens["pad"], special_tokens["eos"], special_tokens["bos"]
        ids = (self._processor.pad_id(), self._processor.eos_id(), self._processor.bos_id())
        if ids != (self.pad_id, self.eos_id, self.bos_id):
            raise ExportError(
                f"{where}: its (pad, eos, bos) ids {ids} differ from config.json's special_tokens "
                f"{(self.pad_id, self.eos_id, self.bos_id)}"
            )

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    def encode(self, text: str, add_eos: bool = True) -> np.ndarray:
        return np.asarray(self._processor.encode(text, add_eos=add_eos), dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._processor.decode([i for i in ids if i not in (self.pad_id, self.bos_id)])
