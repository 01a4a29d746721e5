"""Serving a jaxformer export with plain JAX: `load(directory).translate(sentences)`.

`jaxformer-export` copies this file into every export as `serve.py`. It imports only jax,
numpy, sentencepiece and the standard library (and jax's deserializer flatbuffers, which jax does
not install), so an export runs where jaxformer is not installed:

    import serve                                    # the export directory on sys.path
    model = serve.load("exports/m30k")
    model.translate(["A man rides a horse."])       # -> one translation per sentence
    tokens, scores = model.translate_ids(source)    # int32 [B, S] -> [B, K, S + extra], [B, K]

or from a shell, one sentence per line:

    python exports/m30k/serve.py < sentences.en > sentences.de

The directory holds (the names are config.json's "files", with their SHA-256):
    config.json             model config, decoding settings, special token ids, checkpoint, platforms
    params.safetensors      the parameters in decoding form, named by their paths joined with "/"
    tokenizer.model         the sentencepiece model (the source side's with separate vocabularies)
    tokenizer.target.model  the target side's sentencepiece model, with separate vocabularies only
    beam_search.jaxexport   a serialized jax.export of the jitted beam search:
                            (params, source int32 [B, S]) -> (tokens int32 [B, K, S + max_extra_length],
                            scores float32 [B, K]), B and S symbolic (S <= max_source_length)
    serve.py                this file
    sentence_batches.py     a copy of jaxformer/decoding/sentence_batches.py, which serve.py imports
    argument_parser.py      a copy of jaxformer/argument_parser.py, serve.py's command line

The parameters file is safetensors, read here with numpy alone: an 8-byte little-endian header
length, a JSON header {name: {dtype, shape, data_offsets}} and the raw little-endian bytes.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import importlib.util
import json
import logging
import math
import os
import pathlib
import re
import signal
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

FORMAT = "jaxformer-export"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
LOADER_FILE = "serve.py"
# The jaxformer modules serve.py imports (standard library, numpy and jax only), by their path in
# the package; each is copied beside serve.py under its file name.
LOADER_IMPORTS = ("decoding/sentence_batches.py", "argument_parser.py")
EXIT_NO_SPACE = 75  # a full disk's exit code, jaxformer.errors.EXIT_NO_SPACE, which serve.py cannot import


def _recorded_digest(folder: pathlib.Path, file_name: str) -> str | None:
    """config.json's SHA-256 of the loader helper `file_name` in `folder`, or None where it records
    none (an older export) or cannot be read (`load` then names what is wrong with config.json)."""
    try:
        imports = json.loads((folder / CONFIG_FILE).read_bytes())["files"]["loader"]["imports"]
        digests = [entry.get("sha256") for entry in imports if isinstance(entry, dict) and entry["name"] == file_name]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return digests[0] if digests and isinstance(digests[0], str) else None


def _import_beside(name: str):
    """The module `name`.py in this file's folder: an export's copy of a jaxformer helper, held to
    config.json's SHA-256 before any of its code runs."""
    path = pathlib.Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"serve_{name}", path)
    if spec is None or not path.is_file():
        raise ImportError(f"{path} is missing: serve.py needs it beside itself (export the model again)")
    digest = _recorded_digest(path.parent, path.name)
    if digest is not None and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        raise ImportError(
            f"{path} is damaged or edited: its SHA-256 differs from the one in {path.parent / CONFIG_FILE}"
        )
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001  (an older export's damaged copy, unchecked, fails in any way)
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ImportError(f"{path} cannot be imported ({reason}); export the model again") from None
    return module


_MISSING_HELPER: str | None = None  # why serve.py could not import a helper; `load` and `main` report it
if __package__:  # jaxformer.export.standalone, inside the package
    from jaxformer import argument_parser
    from jaxformer.decoding import sentence_batches
else:  # serve.py, in an export beside its copies of the LOADER_IMPORTS
    try:
        sentence_batches = _import_beside("sentence_batches")
        argument_parser = _import_beside("argument_parser")
    except ImportError as error:  # `import serve` still works; `load` raises ExportError naming the file
        _MISSING_HELPER = str(error)


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
# be null (one shared vocabulary); a sentence is cut every max_source_tokens - 1 tokens.
_CONFIG_INTEGERS = {
    "special_tokens": {"pad": 0, "eos": 0, "bos": 0},
    "model": {"vocab_size": 1, "source_vocab_size": 1},
    "decoding": {"beam_size": 1, "max_extra_length": 0},
    "serving": {"batch_size": 1, "length_bucket": 1, "max_source_tokens": 2, "max_source_length": 1},
}


class ExportError(ValueError):
    """An export directory or one of its files is missing, damaged or of another format; the
    message names the file."""


# -- the files -------------------------------------------------------------------------------


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file by name, in their stored dtypes."""
    return parse_safetensors(_read_bytes(pathlib.Path(path)), path)


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
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise ExportError(f"{directory}: no such directory")
    path = directory / CONFIG_FILE
    if not os.path.lexists(path) and not os.path.lexists(directory / LOADER_FILE):
        # Without serve.py beside it either, no export was ever here; with it, one lost its config.
        raise ExportError(f"{directory} is not a jaxformer export (no {CONFIG_FILE} in it)")
    try:
        config = json.loads(_read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path} is damaged: not valid JSON ({error})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f'{path} is not the config of a jaxformer export (no "format": "{FORMAT}")')
    if config.get("format_version") != FORMAT_VERSION:
        raise ExportError(
            f"{path} has export format version {config.get('format_version')!r}; "
            f"this loader reads version {FORMAT_VERSION}"
        )
    for section, keys in _CONFIG_INTEGERS.items():
        for key, least in keys.items():
            value = config[section].get(key) if isinstance(config.get(section), dict) else None
            if (value is not None or key != "source_vocab_size") and (
                not isinstance(value, int) or isinstance(value, bool) or value < least
            ):
                raise ExportError(f"{path}: {section}.{key} is {value!r}; it must be an integer >= {least}")
    serving = config["serving"]
    longest = serving["length_bucket"] * math.ceil(serving["max_source_tokens"] / serving["length_bucket"])
    if longest > serving["max_source_length"]:
        raise ExportError(
            f"{path}: serving.max_source_tokens {serving['max_source_tokens']} makes rows of {longest} tokens "
            f"(a multiple of length_bucket {serving['length_bucket']}), over max_source_length "
            f"{serving['max_source_length']}"
        )
    _check_file_entries(path, config.get("files"))
    return config


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
    data = _read_bytes(path)
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
        data = _read_bytes(directory / name)
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


def _read_bytes(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file; the export is incomplete") from None
    except OSError as error:
        raise ExportError(f"cannot read {path}: {error.strerror or error}") from None


# -- translating -----------------------------------------------------------------------------


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


class ExportedTranslator:
    """Translates with an export's program. Sentences are tokenized, sorted by length and decoded
    in batches of `batch_size` rows whose length is rounded up to a multiple of the export's
    length bucket; sentences longer than its max_source_tokens are translated in pieces. This
    is what `jaxformer.decoding.translator.Translator` does, so the results are the same."""

    def __init__(
        self,
        config: dict[str, Any],
        params: Any,
        tokenizer: Tokenizer,
        program: jax.export.Exported,
        batch_size: int | None = None,
        target_tokenizer: Tokenizer | None = None,  # separate vocabularies: decodes the output
    ):
        serving = config["serving"]
        self.config, self.tokenizer, self.program = config, tokenizer, program
        self.target_tokenizer = target_tokenizer or tokenizer
        self.params = jax.device_put(params)
        self.batch_size = int(serving["batch_size"] if batch_size is None else batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        self.length_bucket = int(serving["length_bucket"])
        self.max_source_tokens = int(serving["max_source_tokens"])
        self.max_source_length = int(serving["max_source_length"])
        self.vocab_size = int(config["model"].get("source_vocab_size") or config["model"]["vocab_size"])  # source's
        self._run = jax.jit(program.call)  # one compilation per (batch, length) shape

    # -- text -------------------------------------------------------------------------------

    def translate(self, sentences: Iterable[str], progress: bool = False) -> list[str]:
        """One translation per input sentence, in order; an empty sentence gives "". `sentences`:
        any iterable of str (a generator, a file's lines), read once before anything is decoded."""
        return [hypotheses[0][0] for hypotheses in self.translate_nbest(sentences, progress)]

    def translate_nbest(self, sentences: Iterable[str], progress: bool = False) -> list[list[tuple[str, float]]]:
        """Per sentence, the beam's hypotheses as (text, score), best first; `progress` counts
        the decoded pieces on stderr."""
        sentences = sentence_batches.sentence_list(sentences)
        pieces, owners = sentence_batches.split_sentences(
            sentences, self.tokenizer, self.max_source_tokens, self.tokenizer.eos_id
        )
        decoded = self.translate_sequences(pieces, progress)
        return sentence_batches.join_pieces(owners, decoded, len(sentences), self.target_tokenizer.decode)

    # -- ids --------------------------------------------------------------------------------

    def translate_sequences(
        self, sources: Sequence[np.ndarray], progress: bool = False
    ) -> list[list[tuple[np.ndarray, float]]]:
        """Hypotheses (ids, score) per source id sequence (each ending in EOS), in input order. Each
        is checked before any batch runs (`_refuse_bad_ids`), errors naming its index in `sources`."""
        if isinstance(sources, (np.ndarray, jax.Array)) and np.ndim(sources) == 1:
            raise TypeError(f"sources must be a list of id sequences, not one of shape {np.shape(sources)}: pass [ids]")
        sources = [np.asarray(ids) for ids in sources]
        for index, ids in enumerate(sources):
            _refuse_bad_ids(ids, self.tokenizer.eos_id, f"source {index}", self.vocab_size)
        results: list[Any] = [None] * len(sources)
        batches = sentence_batches.length_sorted_batches(
            sources, self.batch_size, self.length_bucket, self.tokenizer.pad_id, self.tokenizer.eos_id
        )
        translated = 0
        for indices, batch in batches:
            tokens, scores = self._decode_batch(batch)  # its filler rows are EOS alone
            for row, index in enumerate(indices):
                results[index] = [(tokens[row, k], float(scores[row, k])) for k in range(tokens.shape[1])]
            translated += len(indices)
            if progress:
                sys.stderr.write(f"\rtranslate: {translated}/{len(sources)}")
        if progress and sources:
            sys.stderr.write("\n")
        return results

    def translate_ids(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The program on padded source rows int32 [B, S] (pad 0, each row ending in EOS):
        (tokens int32 [B, K, S + max_extra_length] best first, ending in EOS then padding,
        scores float32 [B, K], log p / length penalty). A row of padding alone, EOS alone, a row whose
        last id before the padding is not EOS, or one with EOS before that, is refused."""
        source = np.asarray(source)
        if source.ndim != 2 or not np.issubdtype(source.dtype, np.integer) or 0 in source.shape:
            raise ValueError(f"source must be a non-empty integer array [B, S]; got {source.dtype} {source.shape}")
        for row, ids in enumerate(source):
            _refuse_bad_ids(ids[ids != self.tokenizer.pad_id], self.tokenizer.eos_id, f"source row {row}")
        if source.min() < 0 or source.max() >= self.vocab_size:
            raise ValueError(f"source ids must lie in [0, {self.vocab_size}); got {source.min()} .. {source.max()}")
        return self._decode_batch(source)

    def _decode_batch(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if source.shape[1] > self.max_source_length:
            raise ValueError(
                f"source length {source.shape[1]} exceeds the {self.max_source_length} tokens this export "
                "was made for (jaxformer-export --max_source_tokens)"
            )
        tokens, scores = self._run(self.params, source.astype(np.int32))
        return np.asarray(tokens), np.asarray(scores)


def _refuse_bad_ids(ids: np.ndarray, eos_id: int, name: str, vocab_size: int | None = None) -> None:
    """A one-line error naming `name` for ids that are no sentence's: not 1-D, none, not integers
    (a float would be cast when the batch is filled), EOS alone, which the program would give an
    invented translation (`translate` gives such a line ""), a last id other than EOS or EOS before
    the end (sentences run together; sentence_batches.py's check, which both translators share),
    or with `vocab_size` an id outside [0, vocab_size), naming its position. These are the refusals of
    jaxformer/decoding/translator.py's `checked_id_sequences`, kept here because serve.py runs
    without jaxformer and that module imports its model code."""
    if ids.ndim != 1:
        raise ValueError(f"{name} must be one sentence's ids (1-D), got shape {ids.shape}")
    if ids.size == 0:
        raise ValueError(f"{name} is empty: a sentence's ids end with EOS ({eos_id})")
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name}'s ids must be integers, got dtype {ids.dtype}")
    if ids.size == 1 and ids[0] == eos_id:
        raise ValueError(f'{name} is EOS ({eos_id}) alone: no sentence to translate (translate gives it "")')
    sentence_batches.refuse_other_than_one_sentence(ids, eos_id, name)
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size)) if vocab_size is not None else []
    if len(outside):
        raise ValueError(
            f"{name}: id {ids[outside[0]]} at position {outside[0]} is outside the model's source "
            f"vocabulary [0, {vocab_size})"
        )


def load(directory: str | pathlib.Path, batch_size: int | None = None) -> ExportedTranslator:
    """The export in `directory`, ready to translate on this machine; `ExportError` naming the
    file that is missing or damaged, or a program made for other platforms."""
    config, params, tokenizer, target_tokenizer, program = read_export(directory)
    platform = jax.export.default_export_platform()
    if platform not in program.platforms:
        raise ExportError(
            f"{pathlib.Path(directory) / config['files']['program']['name']} was exported for "
            f"{', '.join(program.platforms)}, but JAX runs on {platform} here; export again with --platforms {platform}"
        )
    return ExportedTranslator(config, params, tokenizer, program, batch_size, target_tokenizer)


def read_export(directory: str | pathlib.Path) -> tuple[dict[str, Any], Any, Tokenizer, Tokenizer, jax.export.Exported]:
    """(config, host parameters, source and target tokenizer (one object if shared), program) of an export,
    every file checked against config.json's SHA-256 and the parameters against the program's inputs."""
    if _MISSING_HELPER is not None:
        raise ExportError(_MISSING_HELPER)
    directory = pathlib.Path(directory)
    config = read_config(directory)
    check_loader_files(directory, config)
    separate = config["model"].get("source_vocab_size") is not None
    if separate != ("target_tokenizer" in config["files"]):  # else the target ids would be decoded as source ones
        raise ExportError(
            f"{directory / CONFIG_FILE}: model.source_vocab_size is {config['model'].get('source_vocab_size')} "
            f"({'separate vocabularies' if separate else 'one shared vocabulary'}), but files "
            f"{'lacks' if separate else 'has'} a target_tokenizer"
        )
    tokenizer = read_tokenizer(directory, config, "tokenizer", "source_vocab_size" if separate else "vocab_size")
    target_tokenizer = read_tokenizer(directory, config, "target_tokenizer", "vocab_size") if separate else None
    program_path, data = read_verified(directory, config, "program")
    program = parse_program(data, program_path)
    _check_program_shapes(config, program, directory / CONFIG_FILE, program_path)
    parameters_path, data = read_verified(directory, config, "parameters")
    params = unflatten(parse_safetensors(data, parameters_path), parameters_path)
    _check_parameters(params, program, parameters_path, program_path)
    return config, params, tokenizer, target_tokenizer or tokenizer, program


def _check_program_shapes(config: dict[str, Any], program: jax.export.Exported, config_path, program_path) -> None:
    """config.json's beam size, extra length and longest source are the program's: tokens [B, K, S + extra],
    S bounded by the constraint jax.export wrote into the program's shape assertions at export time."""
    tokens = program.out_avals[0].shape if len(program.out_avals) == 2 else ()
    extra = tokens[2] - program.in_avals[-1].shape[1] if len(tokens) == 3 and program.in_avals else None
    # jax.export's own wording, fixed in the artifact when it was exported; a jax that words it
    # otherwise leaves only the bound unchecked here (the program still asserts it when called).
    bound = re.search(rb"symbolic shape constraint S <= (\d+)\.", program.mlir_module_serialized)
    if not isinstance(extra, int) or not isinstance(tokens[1], int):
        raise ExportError(f"{program_path} is not an exported beam search: tokens [B, K, S + extra] expected")
    decoding, serving = config["decoding"], config["serving"]
    for key, value, fixed, what in (
        ("decoding.beam_size", decoding["beam_size"], tokens[1], "returns {} hypotheses per sentence"),
        ("decoding.max_extra_length", decoding["max_extra_length"], extra, "adds {} tokens to the source length"),
    ):
        if value != fixed:
            raise ExportError(f"{config_path}: {key} is {value}, but {program_path} {what.format(fixed)}")
    if bound is not None and serving["max_source_length"] > int(bound.group(1)):
        raise ExportError(
            f"{config_path}: serving.max_source_length is {serving['max_source_length']}, but {program_path} "
            f"takes sources of at most {int(bound.group(1))} tokens"
        )


def _check_parameters(params: Any, program: jax.export.Exported, params_path, program_path) -> None:
    """The parameters are the ones the program takes: same names, shapes and dtypes."""
    source = jax.ShapeDtypeStruct((1, 1), np.int32)
    if jax.tree.structure(((params, source), {})) != program.in_tree:
        raise ExportError(f"{params_path} does not hold the parameters that {program_path} takes (other names)")
    named = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, leaf), aval in zip(named, program.in_avals):
        if leaf.shape != aval.shape or leaf.dtype != aval.dtype:
            name = "/".join(str(key.key) for key in path)
            raise ExportError(
                f"{params_path}: tensor {name!r} is {leaf.dtype}{list(leaf.shape)}, but {program_path} takes "
                f"{aval.dtype}{list(aval.shape)}"
            )


# -- command line ----------------------------------------------------------------------------


class InputError(ValueError):
    """The text to translate cannot be read; the message names the line."""


def stdin_lines(data: bytes) -> list[str]:
    """The UTF-8 lines of `data` without their line breaks, and without a byte-order mark at its
    start, as translate.py reads stdin (jaxformer/data/parallel_text.py's `decode_lines`, which
    serve.py cannot import; its refusal of lines ended by \\r alone is a file rule, not a
    stream's); a line that is not UTF-8 is an InputError naming it, with that reader's message."""
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the final line break ends the last line
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r"))
        except UnicodeDecodeError as error:
            raise InputError(
                f"<stdin>: line {number} is not valid UTF-8 ({error.reason} at byte {error.start})"
            ) from None
    return lines


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    if _MISSING_HELPER is not None:
        sys.stderr.write(f"error: {_MISSING_HELPER}\n")
        return 2
    parser = argument_parser.Parser(
        description="Translate stdin to stdout, one sentence per line, with a jaxformer export."
    )
    parser.add_argument(
        "directory", nargs="?", default=pathlib.Path(__file__).parent, help="the export (default: this file's folder)"
    )
    parser.add_argument("--batch_size", type=_positive, help="sentences per batch (default: the export's)")
    args = parser.parse_args(argv)
    # The jaxformer commands' log format (a long sentence's warning, say), on stderr, apart from the output.
    logging.basicConfig(format="%(asctime)s %(levelname).1s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    for stream, closed in (  # started with it closed (`<&-`, `>&-`): refused before any work, as by translate.py
        (sys.stdin, "stdin is closed: serve.py translates the lines of stdin"),
        (sys.stdout, "stdout is closed: serve.py writes the translations to stdout"),
    ):
        if stream is None:
            sys.stderr.write(f"error: {closed}\n")
            return 2
    try:
        lines = stdin_lines(sys.stdin.buffer.read())  # before the model: bad input costs no loading
        model = load(args.directory, args.batch_size)
    except (ExportError, InputError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    text = sentence_batches.as_lines(model.translate(lines))  # outside the try: its errors are not the output's
    try:
        # Through the byte buffer, checking what it wrote: a text stream's write drops the short
        # count a buffered writer returns once the pipe's reader has gone (CPython 3.11).
        if not hasattr(sys.stdout, "buffer"):  # a StringIO in its place (a caller capturing the output)
            sys.stdout.write(text)
            return 0
        output = memoryview(text.encode("utf-8"))
        while output:
            output = output[sys.stdout.buffer.write(output) :]
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the reader closed stdout (`| head`): no more is wanted, as SIGPIPE says
        _discard_stdout()
        return 128 + signal.SIGPIPE
    except OSError as error:  # a full disk, EIO, EFBIG (`ulimit -f`), ...: one line, not a traceback
        _discard_stdout()
        where = f"{error.strerror or error} writing <stdout>"
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            sys.stderr.write(f"error: {where}: free space (or quota), then run the same command again\n")
            return EXIT_NO_SPACE
        sys.stderr.write(f"error: {where}: the translations written stop short of the end\n")
        return 2
    return 0


def _discard_stdout() -> None:
    """Points stdout at /dev/null once writing it failed, so that the interpreter's last flush of
    what it still holds does not fail again, with a message, after serve.py has said why."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
