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

The program is the search config.json's decoding.method names: beam search (K = beam_size
hypotheses), greedy search or sampling (K = 1). A sampling export draws as `Translator` does:
one key per batch, split in turn from `jax.random.key(seed)` (config.json's decoding.seed, or
`load(..., seed=)` / `--seed`), the batches in the same order, so the same seed, input and batch
size give `jaxformer-translate --method sample`'s sentences, and each further call draws anew.

The directory holds (the names are config.json's "files", with their SHA-256):
    config.json             model config, decoding settings, special token ids, checkpoint, platforms
    params.safetensors      the parameters in decoding form, named by their paths joined with "/"
    tokenizer.model         the sentencepiece model (the source side's with separate vocabularies)
    tokenizer.target.model  the target side's sentencepiece model, with separate vocabularies only
    beam_search.jaxexport   a serialized jax.export of the jitted beam search:
                            (params, source int32 [B, S]) -> (tokens int32 [B, K, S + max_extra_length],
                            scores float32 [B, K]), B and S symbolic (S <= max_source_length)
    greedy_search.jaxexport in its place for greedy search (K = 1)
    sampling.jaxexport      in its place for sampling (K = 1), with a third input: the batch's key,
                            uint32 [2] (jax.random.key_data of a config.json program.key_impl key)
    serve.py                this file
    sentence_batches.py, argument_parser.py, export_files.py, export_program.py, serve_streams.py,
    text_lines.py, unmarked_wide_text.py: copies of the jaxformer modules serve.py imports (LOADER_IMPORTS)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import pathlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np

FORMAT = "jaxformer-export"
# The newest export format: 2 holds greedy search or sampling, which a loader of version 1 would
# misread; a beam search export is written as version 1, so that every loader reads it.
FORMAT_VERSION = 2
CONFIG_FILE = "config.json"
LOADER_FILE = "serve.py"
# The jaxformer modules serve.py imports (standard library, numpy and jax only), by their path in
# the package; each is copied beside serve.py under its file name.
LOADER_IMPORTS = (
    "data/unmarked_wide_text.py",
    "data/text_lines.py",
    "decoding/sentence_batches.py",
    "argument_parser.py",
    "export/export_files.py",
    "export/export_program.py",
    "export/serve_streams.py",
)
EXIT_NO_SPACE = 75  # a full disk's exit code, jaxformer.errors.EXIT_NO_SPACE, which serve.py cannot import


class ExportError(ValueError):
    """An export directory or one of its files is missing, damaged or of another format; the
    message names the file."""


def _recorded_digest(folder: pathlib.Path, file_name: str) -> str | None:
    """config.json's SHA-256 of the loader helper `file_name` in `folder`, or None where it records
    none (an older export) or cannot be read (`load` then names what is wrong with config.json)."""
    try:
        imports = json.loads((folder / CONFIG_FILE).read_bytes())["files"]["loader"]["imports"]
        digests = [entry.get("sha256") for entry in imports if isinstance(entry, dict) and entry["name"] == file_name]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return digests[0] if digests and isinstance(digests[0], str) else None


def _import_beside(name: str, **given: Any):
    """The module `name`.py in this file's folder: an export's copy of a jaxformer helper, held to
    config.json's SHA-256 before any of its code runs; `given` are the names of this file that it
    uses, which the package's module imports from jaxformer.export.standalone."""
    path = pathlib.Path(__file__).resolve().with_name(f"{name}.py")  # beside the file a link to serve.py names
    spec = importlib.util.spec_from_file_location(f"serve_{name}", path)
    if spec is None or not path.is_file():
        raise ImportError(f"{path} is missing: serve.py needs it beside itself (export the model again)")
    digest = _recorded_digest(path.parent, path.name)
    if digest is not None and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        raise ImportError(
            f"{path} is damaged or edited: its SHA-256 differs from the one in {path.parent / CONFIG_FILE}"
        )
    module = importlib.util.module_from_spec(spec)
    vars(module).update(given)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001  (an older export's damaged copy, unchecked, fails in any way)
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ImportError(f"{path} cannot be imported ({reason}); export the model again") from None
    return module


_MISSING_HELPER: str | None = None  # why serve.py could not import a helper; `load` and `main` report it
if __package__:  # jaxformer.export.standalone, inside the package (whose __init__ imports it before its helpers)
    from jaxformer import argument_parser
    from jaxformer.decoding import sentence_batches
    from jaxformer.export import export_files, export_program, serve_streams
else:  # serve.py, in an export beside its copies of the LOADER_IMPORTS
    try:
        sentence_batches = _import_beside("sentence_batches")
        argument_parser = _import_beside("argument_parser")
        export_files = _import_beside(
            "export_files",
            ExportError=ExportError,
            FORMAT=FORMAT,
            FORMAT_VERSION=FORMAT_VERSION,
            CONFIG_FILE=CONFIG_FILE,
            LOADER_FILE=LOADER_FILE,
        )
        export_program = _import_beside("export_program", ExportError=ExportError, MAX_SEED=export_files.MAX_SEED)
        text_lines = _import_beside("text_lines", unmarked_wide_text=_import_beside("unmarked_wide_text"))
        serve_streams = _import_beside("serve_streams", text_lines=text_lines)
    except ImportError as error:  # `import serve` still works; `load` raises ExportError naming the file
        _MISSING_HELPER = str(error)

# The public names serve.py defined itself until export_files.py and serve_streams.py took them
# (4c781c1): they stay serve.py's too, in an export as in the package, for the code that uses them
# (`serve.read_config(directory)`, `serve.Tokenizer`).
MOVED_TO_HELPERS = {
    "export_files": (
        "SAFETENSORS_DTYPES",
        "Tokenizer",
        "check_loader_files",
        "parse_program",
        "parse_safetensors",
        "read_config",
        "read_safetensors",
        "read_tokenizer",
        "read_verified",
        "unflatten",
    ),
    "serve_streams": ("InputError", "stdin_lines"),
}
if _MISSING_HELPER is None:
    globals().update(
        {name: getattr(globals()[helper], name) for helper, names in MOVED_TO_HELPERS.items() for name in names}
    )


# -- translating -----------------------------------------------------------------------------


class ExportedTranslator:
    """Translates with an export's program. Sentences are tokenized, sorted by length and decoded
    in batches of `batch_size` rows whose length is rounded up to a multiple of the export's
    length bucket; sentences longer than its max_source_tokens are translated in pieces. This
    is what `jaxformer.decoding.translator.Translator` does, so the results are the same."""

    def __init__(
        self,
        config: dict[str, Any],
        params: Any,
        tokenizer: export_files.Tokenizer,
        program: jax.export.Exported,
        batch_size: int | None = None,
        target_tokenizer: export_files.Tokenizer | None = None,  # separate vocabularies: decodes the output
        seed: int | None = None,  # sampling's; None: config.json's decoding.seed
    ):
        serving = config["serving"]
        self.config, self.tokenizer, self.program = config, tokenizer, program
        self.target_tokenizer = target_tokenizer or tokenizer
        self.params = jax.device_put(params)
        self.batch_size = export_program.checked_batch_size(serving["batch_size"] if batch_size is None else batch_size)
        self.length_bucket = int(serving["length_bucket"])
        self.max_source_tokens = int(serving["max_source_tokens"])
        self.max_source_length = int(serving["max_source_length"])
        self.vocab_size = int(config["model"].get("source_vocab_size") or config["model"]["vocab_size"])  # source's
        self.max_positions = config["model"].get("max_positions")  # an imported model's; None: no last position
        self._run = jax.jit(program.call)  # one compilation per (batch, length) shape
        self.method = config["decoding"]["method"]
        self._rng = export_program.first_key(config, seed, CONFIG_FILE)  # sampling's, split once per batch

    # -- text -------------------------------------------------------------------------------

    def translate(self, sentences: Iterable[str], progress: bool = False) -> list[str]:
        """One translation per input sentence, in order; an empty sentence gives "". `sentences`:
        any iterable of str (a generator, a file's lines), read once before anything is decoded."""
        return [hypotheses[0][0] for hypotheses in self.translate_nbest(sentences, progress)]

    def translate_nbest(self, sentences: Iterable[str], progress: bool = False) -> list[list[tuple[str, float]]]:
        """Per sentence, the search's hypotheses as (text, score), best first (beam search's
        beam_size, one for greedy search and sampling); `progress` counts the decoded pieces on stderr."""
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
        """Hypotheses (ids, score) per source id sequence (each ending in EOS, then optionally padding,
        which is dropped), in input order. Each is checked before any batch runs (`_refuse_bad_ids`),
        errors naming its index in `sources`."""
        if isinstance(sources, (np.ndarray, jax.Array)) and np.ndim(sources) == 1:
            raise TypeError(f"sources must be a list of id sequences, not one of shape {np.shape(sources)}: pass [ids]")
        sources = [np.asarray(ids) for ids in sources]
        for index, ids in enumerate(sources):
            _refuse_bad_ids(ids, self.tokenizer, f"source {index}", self.vocab_size, self.max_positions)
        sources = [sentence_batches.without_trailing_padding(ids, self.tokenizer.pad_id) for ids in sources]
        for index, ids in enumerate(sources):  # the program's bound on S, before any batch runs
            if (padded := sentence_batches.padded_length(len(ids), self.length_bucket)) > self.max_source_length:
                raise ValueError(
                    f"source {index} has {len(ids)} ids (EOS included), padded to {padded} (serving.length_bucket "
                    f"{self.length_bucket}): more than the {self.max_source_length} this export's program takes "
                    "(serving.max_source_length, jaxformer-export --max_source_tokens); translate() splits a "
                    "longer sentence into pieces"
                )
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
        scores float32 [B, K], log p / length penalty; K = 1 and log p but for beam search; sampling
        draws with the next key). A row of no ids (`[[]]`), of padding alone, EOS
        alone, a row whose last id before the padding is not EOS, or one with EOS or PAD before that, is
        refused, as `translate_sequences` refuses such a source: only the padding after a row's EOS is
        no part of its sentence. So is a row of more ids than the model's max_positions (its padding not
        counted): the program would compute positions the model never had."""
        source = sentence_batches.padded_rows(source, self.tokenizer.pad_id)
        if source.ndim != 2 or not len(source):  # then each row's check names its fault ([[]]: empty, not float64)
            raise ValueError(f"source must be padded rows of ids [B, S], at least one; got shape {source.shape}")
        for row, ids in enumerate(source):
            _refuse_bad_ids(ids, self.tokenizer, f"source row {row}", self.vocab_size, self.max_positions)
        return self._decode_batch(source)

    def _decode_batch(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if source.shape[1] > self.max_source_length:
            raise ValueError(
                f"source length {source.shape[1]} exceeds the {self.max_source_length} tokens this export "
                "was made for (jaxformer-export --max_source_tokens)"
            )
        key = ()
        if self._rng is not None:  # sampling: this batch's key, split off as Translator splits it
            self._rng, rng = jax.random.split(self._rng)
            key = (jax.random.key_data(rng),)
        tokens, scores = self._run(self.params, source.astype(np.int32), *key)
        return np.asarray(tokens), np.asarray(scores)


def _refuse_bad_ids(
    ids: np.ndarray,
    tokenizer: export_files.Tokenizer,
    name: str,
    vocab_size: int | None = None,
    max_positions: int | None = None,
) -> None:
    """A one-line error naming `name` for ids that are no one sentence's or more than the model's
    `max_positions` (sentence_batches.py's check, which Translator.translate_ids shares and every
    export carries), or with `vocab_size` for an id outside [0, vocab_size), naming its position."""
    sentence_batches.refuse_other_than_one_sentence(ids, tokenizer.eos_id, name, tokenizer.pad_id, max_positions)
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size)) if vocab_size is not None else []
    if len(outside):
        raise ValueError(
            f"{name}: id {ids[outside[0]]} at position {outside[0]} is outside the model's source "
            f"vocabulary [0, {vocab_size})"
        )


def load(directory: str | pathlib.Path, batch_size: int | None = None, seed: int | None = None) -> ExportedTranslator:
    """The export in `directory`, ready to translate on this machine; `ExportError` naming the
    file that is missing or damaged, or a program made for other platforms. `seed`: a sampling
    export's (default: config.json's decoding.seed); a ValueError for another export's, or one
    out of a key's range."""
    if _MISSING_HELPER is not None:
        raise ExportError(_MISSING_HELPER)
    config = export_files.read_config(directory)
    export_program.check_seed(config, seed)  # config.json alone: before any parameter is read
    if batch_size is not None:
        export_program.checked_batch_size(batch_size)
    config, params, tokenizer, target_tokenizer, program = _read_files(pathlib.Path(directory), config)
    platform = jax.export.default_export_platform()
    if platform not in program.platforms:
        raise ExportError(
            f"{pathlib.Path(directory) / config['files']['program']['name']} was exported for "
            f"{', '.join(program.platforms)}, but JAX runs on {platform} here; export again with --platforms {platform}"
        )
    return ExportedTranslator(config, params, tokenizer, program, batch_size, target_tokenizer, seed)


def read_export(
    directory: str | pathlib.Path,
) -> tuple[dict[str, Any], Any, export_files.Tokenizer, export_files.Tokenizer, jax.export.Exported]:
    """(config, host parameters, source and target tokenizer (one object if shared), program) of an export,
    every file checked against config.json's SHA-256 and the parameters against the program's inputs."""
    if _MISSING_HELPER is not None:
        raise ExportError(_MISSING_HELPER)
    return _read_files(pathlib.Path(directory), export_files.read_config(directory))


def _read_files(
    directory: pathlib.Path, config: dict[str, Any]
) -> tuple[dict[str, Any], Any, export_files.Tokenizer, export_files.Tokenizer, jax.export.Exported]:
    """read_export's reading of the files that `config`, the export's config.json, names."""
    export_files.check_loader_files(directory, config)
    separate = config["model"].get("source_vocab_size") is not None
    if separate != ("target_tokenizer" in config["files"]):  # else the target ids would be decoded as source ones
        raise ExportError(
            f"{directory / CONFIG_FILE}: model.source_vocab_size is {config['model'].get('source_vocab_size')} "
            f"({'separate vocabularies' if separate else 'one shared vocabulary'}), but files "
            f"{'lacks' if separate else 'has'} a target_tokenizer"
        )
    size_key = "source_vocab_size" if separate else "vocab_size"
    tokenizer = export_files.read_tokenizer(directory, config, "tokenizer", size_key)
    target_tokenizer = (
        export_files.read_tokenizer(directory, config, "target_tokenizer", "vocab_size") if separate else None
    )
    program_path, data = export_files.read_verified(directory, config, "program")
    program = export_files.parse_program(data, program_path)
    export_program.check_program_shapes(config, program, directory / CONFIG_FILE, program_path)
    parameters_path, data = export_files.read_verified(directory, config, "parameters")
    params = export_files.unflatten(export_files.parse_safetensors(data, parameters_path), parameters_path)
    export_program.check_parameters(
        params, program, parameters_path, program_path, export_program.program_inputs(config)
    )
    return config, params, tokenizer, target_tokenizer or tokenizer, program


# -- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    if _MISSING_HELPER is not None:
        sys.stderr.write(f"error: {_MISSING_HELPER}\n")
        return 2
    parser = argument_parser.Parser(
        description="Translate stdin to stdout, one sentence per line, with a jaxformer export."
    )
    parser.add_argument(
        "directory",
        nargs="?",
        type=argument_parser.path_text,  # as the commands' path flags: "" refused, "~" the home folder
        default=pathlib.Path(__file__).resolve().parent,
        help="the export (default: this file's folder)",
    )
    parser.add_argument(
        "--batch_size", type=serve_streams.positive_integer, help="sentences per batch (default: the export's)"
    )
    parser.add_argument(
        "--seed",
        type=serve_streams.seed_number,
        help="a sampling export's seed: the same seed, input and --batch_size sample alike, and as "
        "jaxformer-translate --method sample --seed does (default: the export's)",
    )
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
        lines = serve_streams.stdin_lines(sys.stdin.buffer.read())  # before the model: bad input costs no loading
        model = load(args.directory, args.batch_size, args.seed)
    except (ExportError, serve_streams.InputError, export_program.SeedError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    text = sentence_batches.as_lines(model.translate(lines))  # outside the try: its errors are not the output's
    return serve_streams.write_stdout(text, EXIT_NO_SPACE)


if __name__ == "__main__":
    sys.exit(main())
