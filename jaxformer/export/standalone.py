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
    exported_translator.py, text_lines.py, unmarked_wide_text.py: copies of the jaxformer modules
                            serve.py imports (LOADER_IMPORTS)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import jax

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
    "export/exported_translator.py",
)


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
    from jaxformer.export import export_files, export_program, exported_translator, serve_streams
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
        serve_streams = _import_beside("serve_streams", text_lines=text_lines, argument_parser=argument_parser)
        exported_translator = _import_beside(
            "exported_translator",
            sentence_batches=sentence_batches,
            export_files=export_files,
            export_program=export_program,
            CONFIG_FILE=CONFIG_FILE,
        )
    except ImportError as error:  # `import serve` still works; `load` raises ExportError naming the file
        _MISSING_HELPER = str(error)

# The public names serve.py defined itself until export_files.py and serve_streams.py (4c781c1),
# then exported_translator.py, took them, and EXIT_NO_SPACE, argument_parser.py's, of which serve.py
# held a copy: they stay serve.py's too, in an export as in the package, for the code that uses them
# (`serve.read_config(directory)`, `serve.Tokenizer`).
MOVED_TO_HELPERS = {
    "argument_parser": ("EXIT_NO_SPACE",),
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
    "exported_translator": ("ExportedTranslator",),
}
if _MISSING_HELPER is None:
    globals().update(
        {name: getattr(globals()[helper], name) for helper, names in MOVED_TO_HELPERS.items() for name in names}
    )


# -- loading ---------------------------------------------------------------------------------


def load(
    directory: str | pathlib.Path, batch_size: int | None = None, seed: int | None = None
) -> exported_translator.ExportedTranslator:
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
    config, params, tokenizer, target_tokenizer, program = _read_files(
        pathlib.Path(directory), config, _refuse_another_platform
    )
    return exported_translator.ExportedTranslator(
        config, params, tokenizer, program, batch_size, target_tokenizer, seed
    )


def _refuse_another_platform(program: jax.export.Exported, program_path: pathlib.Path) -> None:
    """An ExportError where `program` runs on none of this machine's platforms; `load` checks it as
    soon as the program is read, before the parameters (of a base model, hundreds of MB, each byte
    hashed) are."""
    platform = jax.export.default_export_platform()
    if platform not in program.platforms:
        raise ExportError(
            f"{program_path} was exported for {', '.join(program.platforms)}, but JAX runs on {platform} here; "
            f"export again with --platforms {platform}"
        )


def read_export(
    directory: str | pathlib.Path,
) -> tuple[dict[str, Any], Any, export_files.Tokenizer, export_files.Tokenizer, jax.export.Exported]:
    """(config, host parameters, source and target tokenizer (one object if shared), program) of an export,
    every file checked against config.json's SHA-256 and the parameters against the program's inputs."""
    if _MISSING_HELPER is not None:
        raise ExportError(_MISSING_HELPER)
    return _read_files(pathlib.Path(directory), export_files.read_config(directory))


def _read_files(
    directory: pathlib.Path, config: dict[str, Any], check_program: Callable[..., None] | None = None
) -> tuple[dict[str, Any], Any, export_files.Tokenizer, export_files.Tokenizer, jax.export.Exported]:
    """read_export's reading of the files that `config`, the export's config.json, names;
    `check_program(program, path)` runs once the program is read, before the parameters are."""
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
    if check_program is not None:
        check_program(program, program_path)
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
    return serve_streams.write_stdout(text)


if __name__ == "__main__":
    sys.exit(main())
