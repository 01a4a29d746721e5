"""An export's output folder, checked before any work: absent, empty, or with `overwrite` an
export and nothing else. The export is written through jaxformer/staged_folder.py (`EXPORT`):
staged beside it, moved into place once complete and read back, config.json moved last."""

from __future__ import annotations

import json
import os
import pathlib

from jaxformer import staged_folder
from jaxformer.export import standalone
from jaxformer.export.loading import ExportError

EXPORT = staged_folder.Writer("export", ExportError, last=standalone.CONFIG_FILE)


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


def check_output(output: pathlib.Path, overwrite: bool, staging: pathlib.Path | None = None) -> None:
    """`ExportError` unless `output` is absent, an empty directory, or (with `overwrite`) an export
    and nothing else, the export's own `staging` directory aside."""
    if output.is_symlink():  # the new export is renamed into place: it would replace the link, not fill its folder
        raise ExportError(f"--output {output}: is a symbolic link (to {os.readlink(output)}); give the folder itself")
    if output.exists() and not output.is_dir():
        raise ExportError(f"--output {output}: is a file, not a directory")
    staged_folder.check_placeable(output, EXPORT)
    entries = [path for path in output.iterdir() if path != staging] if output.is_dir() else []
    if not entries:
        return
    export_files = _export_files(output)
    if export_files is None:  # --overwrite would not replace it either: not named as the way out
        raise ExportError(
            f"--output {output}: holds something other than a jaxformer export (no readable "
            f"{standalone.CONFIG_FILE}); not replacing it, even with --overwrite: give a new or empty folder"
        )
    cache = output / "__pycache__"  # serve.py and its helper, compiled where they ran
    others = [path for path in entries if path.name not in export_files or not path.is_file()]
    if cache.is_dir():
        modules = {name.removesuffix(".py") for name in export_files if name.endswith(".py")}
        others.remove(cache)
        others += [path for path in cache.iterdir() if path.suffix != ".pyc" or path.name.split(".")[0] not in modules]
    if others:
        raise ExportError(
            f"--output {output}: holds {min(others)}, which is not part of the export in it; "
            "not replacing it, even with --overwrite (move it elsewhere first)"
        )
    if not overwrite:
        raise ExportError(f"--output {output}: is not empty; pass --overwrite to replace the export in it")
