"""Whether a folder given where a training run belongs is jaxformer-export's output, and which run
it was exported from: an export holds the parameters in their decoding form for its program,
without the run's config, so no command that reads a run reads it; the run its config.json
records does. Likewise a folder of a workdir, or a step in one, given for the workdir."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from jaxformer.run.directory import CHECKPOINT_KINDS, RunDirectory

# What marks jaxformer-export's folder: config.json's "format" (jaxformer.export.standalone.FORMAT,
# which run cannot import; tests/training/test_init_from.py holds them equal) or its loader file.
EXPORT_FORMAT, EXPORT_LOADER = "jaxformer-export", "serve.py"


@dataclasses.dataclass(frozen=True)
class ExportOrigin:
    """The run an export was made from, as its config.json records it (None where it names none),
    and the checkpoint to choose there: its kind, or the step exported where that was the newest
    ("latest" of that run may have moved on since)."""

    workdir: str | None
    checkpoint: str | int | None


def export_origin(path: str | pathlib.Path) -> ExportOrigin | None:
    """The origin of the export at `path`, or None where `path` is no export's folder."""
    folder = pathlib.Path(path)
    try:
        config = json.loads((folder / "config.json").read_bytes())
    except (OSError, ValueError):
        config = None
    if (
        not (isinstance(config, dict) and config.get("format") == EXPORT_FORMAT)
        and not (folder / EXPORT_LOADER).is_file()
    ):
        return None
    recorded = config.get("checkpoint") if isinstance(config, dict) else None
    workdir = recorded.get("workdir") if isinstance(recorded, dict) else None
    if not isinstance(workdir, str):
        return ExportOrigin(None, None)
    which, step = recorded.get("which"), recorded.get("step")
    return ExportOrigin(workdir, which if which in CHECKPOINT_KINDS and which != "latest" else step)


def export_description(path: str | pathlib.Path) -> str:
    """How errors name an export's folder."""
    return (
        f"{path} is an export (jaxformer-export's folder: parameters in decoding form for its program, "
        "without a checkpoint's run config), not a training run"
    )


def to_the_run_exported_from(origin: ExportOrigin, verb: str, workdir: str, checkpoint: str) -> str:
    """The clause that sends a user from an export to the run `origin` names: to `verb` it ("give",
    "start from"), named as the command is told a run and its checkpoint, by flags (`workdir`
    "--workdir", `checkpoint` "--checkpoint") or by config keys ("training.init_from",
    "training.init_checkpoint")."""
    if origin.workdir is None:
        return f"{verb} the training run it was exported from (its config.json names none)"
    flags = workdir.startswith("--")
    setting = " " if flags else "="
    run = f"{workdir}{setting}{origin.workdir}"
    if origin.checkpoint is not None:
        run += f" {checkpoint}{setting}{origin.checkpoint}"
    return f"{verb} the run it was exported from{', ' if flags else ': '}{run}"


def given_instead_of_a_run(path: pathlib.Path, checkpoint_flag: str | None = "--checkpoint") -> str | None:
    """What `path`, given where a training run's workdir belongs, is instead, and what to give: an
    export (then the run it was exported from), one of a workdir's folders or a step in one (then
    that workdir, and by `checkpoint_flag` the checkpoint to choose there; None for a command that
    chooses none, as averaging); None where `path` is none of these."""
    origin = export_origin(path)
    if origin is not None:
        if checkpoint_flag is None:
            origin = dataclasses.replace(origin, checkpoint=None)
        run = to_the_run_exported_from(origin, "give", "--workdir", checkpoint_flag or "")
        return f"{export_description(path)}: serve it with python {path / EXPORT_LOADER}, or {run}"
    kinds = {RunDirectory(path.parent).checkpoint_directory(kind).name: kind for kind in CHECKPOINT_KINDS}
    if path.name in kinds:
        return f"{path} is the {path.name}/ folder of the workdir {path.parent}: give that workdir"
    if path.name.isdigit() and path.parent.name in kinds:
        workdir, kind = path.parent.parent, kinds[path.parent.name]
        said = f"{path} is a step folder of the workdir {workdir}: give that workdir"
        if checkpoint_flag is None:
            return said
        return f"{said} and {checkpoint_flag} {path.name if kind == 'latest' else kind}"
    return None
