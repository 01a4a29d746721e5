"""A training run's checkpoint as a self-contained export directory (`jaxformer-export`).

The export is written into a temporary directory beside the output and renamed into place once
complete and read back, so a crash never leaves half an export. An output that is a mount point
(a Docker volume), which no rename can replace, is staged inside itself and its entries are
moved in, config.json last: a crash between those moves leaves no loadable export, never a mixed
one. A move that fails undoes those before it. A non-empty output is replaced only when asked to
(`overwrite`), and only if it is an export itself. Its contents are listed
in jaxformer/export/standalone.py, which is copied into it as serve.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import math
import os
import pathlib
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from jaxformer.decoding.checkpoint_alpha import ChosenSearch, checkpoint_settings
from jaxformer.decoding.generate import DecodeSettings, decoding_variant
from jaxformer.errors import CheckpointError
from jaxformer.export import staging_leftovers, standalone
from jaxformer.export.loading import ExportError, check_export
from jaxformer.export.program import KNOWN_PLATFORMS, PLATFORMS, export_beam_search
from jaxformer.export.safetensors import flatten, unflatten, write_safetensors
from jaxformer.files import is_mount_point, unwritable_folder_reason
from jaxformer.run.loading import load_checkpoint, require_architecture
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)

PARAMETERS_FILE = "params.safetensors"
TOKENIZER_FILE = "tokenizer.model"  # the shared vocabulary's, or the source side's
TARGET_TOKENIZER_FILE = "tokenizer.target.model"  # with separate vocabularies only
PROGRAM_FILE = "beam_search.jaxexport"
PACKAGE_FOLDER = pathlib.Path(standalone.__file__).parents[1]  # jaxformer/, where LOADER_IMPORTS are


@dataclasses.dataclass(frozen=True)
class ServingSettings:
    """How the loader batches sentences. length_bucket and max_source_tokens default to
    `Translator`'s; batch_size to 64, twice Translator's 32."""

    batch_size: int = 64  # rows per decoding batch
    length_bucket: int = 16  # source lengths are rounded up to a multiple of this
    max_source_tokens: int = 256  # longer sentences are translated in pieces

    @property
    def max_source_length(self) -> int:
        """The longest source row the program takes: max_source_tokens, rounded up to the bucket."""
        return self.length_bucket * math.ceil(self.max_source_tokens / self.length_bucket)


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    directory: pathlib.Path
    step: int
    platforms: tuple[str, ...]  # the program's
    failed: dict[str, str]  # platforms asked for whose lowering failed, and why


def export_checkpoint(
    workdir: str | os.PathLike,
    output: str | os.PathLike,
    checkpoint: str | int = "latest",
    settings: DecodeSettings | None = None,
    serving: ServingSettings = ServingSettings(),
    *,
    platforms: Sequence[str] = PLATFORMS,
    overwrite: bool = False,
    on_placed: Callable[[], None] | None = None,
    chosen: ChosenSearch | None = None,
) -> ExportSummary:
    """Exports `checkpoint` of the run in `workdir` ("latest", "best", "averaged", "final" or a step) into
    the directory `output`, for beam search with `settings` on `platforms` (those whose lowering
    fails are left out and reported in the summary and config.json; no `settings`: DecodeSettings()
    with, on "final", the alpha the run chose, as `Translator.from_workdir`). `on_placed()` is
    called once the export is in place, before a signal that came during the final move is raised
    again (the export command takes one from then on as late: its work is done). `chosen`: final/'s
    `chosen_search`, when the caller read it already (the export command, for its flags)."""
    try:
        output = pathlib.Path(output).absolute()  # "." has no parent to stage beside
    except FileNotFoundError:  # a relative path in a removed folder
        raise ExportError(f"the output {output}: the current folder no longer exists; cd to one that does") from None
    if settings is not None and settings.method != "beam":
        raise ExportError(f"an export holds a beam search; decoding method {settings.method!r} cannot be exported")
    unknown = sorted(set(platforms) - set(KNOWN_PLATFORMS))
    if unknown or not platforms:
        raise ExportError(f"platforms {', '.join(unknown) or '(none)'}: choose among {', '.join(KNOWN_PLATFORMS)}")
    repeated = sorted({platform for platform in platforms if list(platforms).count(platform) > 1})
    if repeated:
        raise ExportError(f"platforms {', '.join(platforms)}: {', '.join(repeated)} given more than once")
    staging_leftovers.remove_dead(output if _staged_inside(output) else output.parent, output)
    check_output(output, overwrite)
    require_architecture(  # before the parameters are read or anything is lowered
        workdir,
        checkpoint,
        "encoder_decoder",
        "an export holds a translator's beam search and needs an encoder_decoder one",
        ExportError,
    )
    settings = checkpoint_settings(workdir, checkpoint, settings, chosen)
    with staging_directory(output) as staging:
        step, metadata, params = load_checkpoint(workdir, checkpoint)
        config, params = decoding_variant(metadata.model_config(), params)
        separate = metadata.target_tokenizer is not None  # separate source and target vocabularies
        for side, model_size, tokenizer in (
            ("source" if separate else "shared", config.encoder_vocab_size, metadata.load_tokenizer()),
            *([("target", config.vocab_size, metadata.load_target_tokenizer())] if separate else []),
        ):
            if tokenizer.vocab_size != model_size:
                raise CheckpointError(
                    f"step {step} of {workdir}: the model's {side} vocabulary has {model_size} tokens, "
                    f"its tokenizer {tokenizer.vocab_size}"
                )
        params = unflatten(flatten(jax.device_get(params)), "the checkpoint")  # plain dicts of host arrays
        logger.info("exporting the beam search for %s", ", ".join(platforms))
        program, failed = export_beam_search(config, settings, params, serving.max_source_length, platforms)
        files = {
            "parameters": write_parameters(staging, params),
            "tokenizer": write_tokenizer(staging, TOKENIZER_FILE, metadata.tokenizer),
            **(
                {"target_tokenizer": write_tokenizer(staging, TARGET_TOKENIZER_FILE, metadata.target_tokenizer)}
                if separate
                else {}
            ),
            "program": write_program(staging, program),
        }
        shutil.copyfile(standalone.__file__, staging / standalone.LOADER_FILE)
        for module in standalone.LOADER_IMPORTS:
            shutil.copyfile(PACKAGE_FOLDER / module, staging / pathlib.PurePath(module).name)
        description = {
            "format": standalone.FORMAT,
            "format_version": standalone.FORMAT_VERSION,
            "model": config.to_dict(),  # the decoding variant, which the parameters are laid out for
            "decoding": dataclasses.asdict(settings),
            "special_tokens": {"pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID, "bos": BOS_ID},
            "serving": {**dataclasses.asdict(serving), "max_source_length": serving.max_source_length},
            "checkpoint": {
                "workdir": str(pathlib.Path(workdir).resolve()),
                "which": checkpoint,  # latest, best, averaged or a step number
                "step": step,
                "bleu": metadata.bleu,
                "averaged_steps": metadata.averaged_steps,
            },
            "platforms": list(program.platforms),
            "platforms_failed": failed,
            "program": {
                "inputs": "params, source int32 [B, S] (0 = padding), 1 <= S <= max_source_length",
                "outputs": "tokens int32 [B, K, S + max_extra_length], scores float32 [B, K]; K = beam_size",
                "jax_version": jax.__version__,
                "calling_convention_version": program.calling_convention_version,
            },
            "files": {
                **files,
                "loader": {
                    **_file_entry(staging / standalone.LOADER_FILE),
                    "imports": [
                        _file_entry(staging / pathlib.PurePath(module).name) for module in standalone.LOADER_IMPORTS
                    ],
                },
            },
        }
        (staging / standalone.CONFIG_FILE).write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
        check_export(staging)  # what was written reads back: every file, the parameters against the program
        check_output(output, overwrite, staging)  # nothing else appeared there meanwhile
        _raise_held_signal()
        _move_into_place(staging, output, on_placed)
    logger.info("wrote %s", output)
    return ExportSummary(output, step, tuple(program.platforms), failed)


# -- the files -------------------------------------------------------------------------------


def _file_entry(path: pathlib.Path) -> dict[str, str]:
    with open(path, "rb") as handle:
        return {"name": path.name, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}


def write_parameters(directory: pathlib.Path, params: Any) -> dict[str, str]:
    path = directory / PARAMETERS_FILE
    write_safetensors(path, flatten(params), metadata={"format": standalone.FORMAT})
    return _file_entry(path)


def write_tokenizer(directory: pathlib.Path, name: str, model_proto: bytes) -> dict[str, str]:
    """A sentencepiece model proto, as the checkpoint holds it."""
    path = directory / name
    path.write_bytes(model_proto)
    return _file_entry(path)


def write_program(directory: pathlib.Path, program: jax.export.Exported) -> dict[str, str]:
    try:
        data = program.serialize()
    except ImportError as error:  # jax serializes with flatbuffers, which it does not require
        raise ExportError(f"serializing the program needs the flatbuffers package ({error})") from None
    path = directory / PROGRAM_FILE
    path.write_bytes(data)
    return _file_entry(path)


# -- the output directory --------------------------------------------------------------------


def _export_files(directory: pathlib.Path) -> set[str] | None:
    """The names of the files the export in `directory` consists of (those its config.json lists,
    and itself), or None if `directory` holds no export."""
    try:
        config = json.loads((directory / standalone.CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("format") != standalone.FORMAT:
        return None
    files = config.get("files") if isinstance(config.get("files"), dict) else {}
    loader = files.get("loader") if isinstance(files.get("loader"), dict) else {}
    imports = loader.get("imports") if isinstance(loader.get("imports"), list) else []
    entries = [*files.values(), *imports]
    names = [entry.get("name") if isinstance(entry, dict) else entry for entry in entries]
    return {name for name in names if isinstance(name, str)} | {standalone.CONFIG_FILE}


def _staged_inside(output: pathlib.Path) -> bool:
    """Whether the export is staged inside `output` and its entries moved in: a mount point cannot
    be renamed or replaced (EBUSY), nor can anything be renamed into it from outside (EXDEV)."""
    return output.is_dir() and is_mount_point(output)


def check_output(output: pathlib.Path, overwrite: bool, staging: pathlib.Path | None = None) -> None:
    """`ExportError` unless `output` is absent, an empty directory, or (with `overwrite`) an export
    and nothing else, the export's own `staging` directory aside."""
    if output.is_symlink():  # the new export is renamed into place: it would replace the link, not fill its folder
        raise ExportError(
            f"the output {output} is a symbolic link (to {os.readlink(output)}); give the folder itself as --output"
        )
    if output.exists() and not output.is_dir():
        raise ExportError(f"the output {output} is a file, not a directory")
    try:
        current = pathlib.Path.cwd().resolve()
    except FileNotFoundError:  # a removed folder: it holds no output, and the output is absolute
        current = None
    resolved = output.resolve()
    if current is not None and (resolved == current or resolved in current.parents):
        raise ExportError(
            f"the output {output} holds the current folder: the export is renamed into place, which would take the "
            "folder from under this shell; give another folder, e.g. ./export"
        )
    folder = output if _staged_inside(output) else output.parent  # where the export is staged
    unwritable = unwritable_folder_reason(folder)
    if unwritable:
        where = "" if folder == output else f"{folder}: "  # the reason names the mount point already
        raise ExportError(f"cannot write the export {output}: {where}{unwritable}")
    entries = [path for path in output.iterdir() if path != staging] if output.is_dir() else []
    if not entries:
        return
    if not overwrite:
        raise ExportError(f"the output directory {output} is not empty; pass --overwrite to replace the export in it")
    export_files = _export_files(output)
    if export_files is None:
        raise ExportError(
            f"the output directory {output} holds something other than a jaxformer export (no readable "
            f"{standalone.CONFIG_FILE}); not replacing it, even with --overwrite"
        )
    cache = output / "__pycache__"  # serve.py and its helper, compiled where they ran
    others = [path for path in entries if path.name not in export_files or not path.is_file()]
    if cache.is_dir():
        modules = {name.removesuffix(".py") for name in export_files if name.endswith(".py")}
        others.remove(cache)
        others += [path for path in cache.iterdir() if path.suffix != ".pyc" or path.name.split(".")[0] not in modules]
    if others:
        raise ExportError(
            f"the output directory {output} holds {min(others)}, which is not part of the export in it; "
            "not replacing it, even with --overwrite (move it elsewhere first)"
        )


@contextlib.contextmanager
def staging_directory(output: pathlib.Path) -> Iterator[pathlib.Path]:
    """A new directory beside `output` (on the same file system, so it can be renamed into
    place), or inside it where it is a mount point; removed if the export fails."""
    staging = None
    try:
        # A signal while it is made is raised once `staging` names it, so that it is removed too.
        with _signals_deferred():
            try:
                output.parent.mkdir(parents=True, exist_ok=True)
                folder = output if _staged_inside(output) else output.parent
                staging = pathlib.Path(tempfile.mkdtemp(dir=folder, prefix=f".{output.name}.", suffix=".partial"))
            except OSError as error:
                raise ExportError(f"cannot write the export beside {output}: {error.strerror or error}") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's is private to its owner; an export is not
        with staging_leftovers.held(staging):
            yield staging
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)  # gone already once moved into place


def _raise_held_signal() -> None:
    """A signal that the handler in place holds (the export command's RaiseOnSignal holds one that
    came inside JAX's code, which an export is mostly) stops the export here, before it is put in
    place, not after."""
    holder = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    if callable(getattr(holder, "check", None)):
        holder.check()


def _move_into_place(staging: pathlib.Path, output: pathlib.Path, on_placed: Callable[[], None] | None = None) -> None:
    """Renames `staging` to `output`, the export there (which check_output let through) moved
    aside first and removed once the new one is in place. A `staging` inside `output` (a mount
    point) has its entries moved in instead, the old export's config.json out first and the new
    one's in last. A rename that fails undoes those before it: the old export stays in place and
    nothing is left beside it. `on_placed()` is called once it is in place, before a signal that
    came meanwhile is raised again."""
    # A signal between the renames would leave the old export hidden beside an absent output, and
    # its handler would then delete the new one with the staging directory.
    with _signals_deferred():
        old = [entry for entry in output.iterdir() if entry != staging] if output.is_dir() else []
        retired, placed = None, False
        try:
            if old:
                retired = pathlib.Path(tempfile.mkdtemp(dir=staging.parent, prefix=f".{output.name}.", suffix=".old"))
            if staging.parent == output:
                config_last = sorted(staging.iterdir(), key=lambda entry: entry.name == standalone.CONFIG_FILE)
                config_first = sorted(old, key=lambda entry: entry.name != standalone.CONFIG_FILE)
                moves = [(entry, retired / entry.name) for entry in config_first]
                moves += [(entry, output / entry.name) for entry in config_last]
            else:
                moves = [(output, retired)] if old else []
                moves += [(staging, output)]  # onto an absent output, or an empty directory (which rename replaces)
            _rename_all(moves)
            placed = True
        except OSError as error:
            raise ExportError(_move_failure(output, error, retired)) from None
        finally:
            if retired is not None and placed:
                shutil.rmtree(retired, ignore_errors=True)
            elif retired is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(retired)  # empty (or gone) once the renames are undone
        if on_placed is not None:
            on_placed()


def _rename_all(moves: list[tuple[pathlib.Path, pathlib.Path]]) -> None:
    """Each (source, target) renamed in turn; if one fails, those done are renamed back, last first."""
    done = []
    try:
        for source, target in moves:
            os.replace(source, target)
            done.append((source, target))
    except OSError:
        for source, target in reversed(done):
            with contextlib.suppress(OSError):
                os.replace(target, source)
        raise


def _move_failure(output: pathlib.Path, error: OSError, retired: pathlib.Path | None) -> str:
    """The one line saying that the export could not be moved into `output`, and where the old one is
    if putting it back failed too."""
    message = f"cannot move the export into {output}: {error.strerror or error}"
    if error.errno == errno.EBUSY:  # a mount point that is_mount_point did not see
        message += f" ({output} is in use, a mount point?): give a folder inside it, e.g. {output / 'export'}"
    if retired is not None and retired.exists() and any(retired.iterdir()):
        message += f"; the previous export is in {retired}"
    return message


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT received inside are raised again on leaving, to the handlers then in
    place. (Blocking them would not do: another thread, jax's, would take them.) Outside the main
    thread signals are left alone."""
    received, previous = [], {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
        for signum in received:
            signal.raise_signal(signum)
