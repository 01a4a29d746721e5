"""Sweep files: a Python file whose `get_sweep()` returns {variant name: [override, ...]}, the
ones shipped in jaxformer/configs/sweeps/ by name. A name that cannot be a run's folder, or one
that Python would silently drop (a key written twice in one dict), is an error naming it."""

from __future__ import annotations

import ast
import pathlib
import re

from jaxformer.model.config import ConfigError
from jaxformer.run.directory import SweepDirectory
from jaxformer.training.config_file import call_file_function, packaged_config_directory
from jaxformer.training.shipped_names import shipped_file_path

VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a folder name on every platform
# A file system's names end at 255 bytes: room for a seed's suffix (@seed12) and a pace's .json.
MAX_VARIANT_NAME = 100


def packaged_sweep_directory() -> pathlib.Path:
    return packaged_config_directory() / "sweeps"


def sweep_path(name_or_path: str) -> pathlib.Path:
    """jaxformer/configs/sweeps/NAME.py for a name, else the path as given (as --config's, hints alike)."""
    return shipped_file_path(name_or_path, packaged_sweep_directory(), "sweep", "--sweep")


def load_sweep(name_or_path: str) -> dict[str, list[str]]:
    """{variant name: [override, ...]} from the sweep file's get_sweep()."""
    path = sweep_path(name_or_path)
    sweep = call_file_function(path, "get_sweep", "sweep file")  # a syntax error is named here
    refuse_repeated_dict_keys(path)
    if not isinstance(sweep, dict) or not sweep:
        raise ConfigError(f"sweep file {path}: get_sweep() must return a non-empty dict of variant name -> overrides")
    for name, overrides in sweep.items():
        if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name):
            raise ConfigError(f"sweep file {path}: variant name {name!r} must match {VARIANT_NAME.pattern}")
        if len(name) > MAX_VARIANT_NAME:
            raise ConfigError(
                f"sweep file {path}: variant name {name[:20]}... is {len(name)} characters long, more than the "
                f"{MAX_VARIANT_NAME} its runs' folders may be named with; shorten it"
            )
        if name.lower() in SweepDirectory.OWN_NAMES:
            raise ConfigError(
                f"sweep file {path}: variant name {name!r} is taken: the sweep's workdir holds its own "
                f"{', '.join(SweepDirectory.OWN_NAMES)} beside the variants' runs; choose another"
            )
        # a list or tuple only: a dict's values would be dropped unread, a number or None is no list
        if not isinstance(overrides, (list, tuple)) or not all(isinstance(item, str) for item in overrides):
            given = repr(overrides)
            given = given if len(given) <= 60 else given[:57] + "..."
            # A string alone reads as a KEY=VALUE itself: say what it lacks, the list around it.
            hint = f": a string alone is no list; write [{given}]" if isinstance(overrides, str) else ""
            raise ConfigError(
                f"sweep file {path}: variant {name!r} must list its overrides as strings KEY=VALUE, not {given}{hint}"
            )
    return sweep


def refuse_repeated_dict_keys(path: pathlib.Path) -> None:
    """A ConfigError when a dict display in the file writes one literal key twice: Python keeps the
    second's value only, so a variant written twice under one name would be lost without a word."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Dict):
            continue
        first_line: dict[object, int] = {}
        for key in node.keys:
            if not isinstance(key, ast.Constant):  # **spread, or a key computed when the file runs
                continue
            if key.value in first_line:
                first = first_line[key.value]
                lines = f"on line {first}" if first == key.lineno else f"lines {first} and {key.lineno}"
                raise ConfigError(
                    f"sweep file {path}: key {key.value!r} is written twice in one dict, {lines}, and Python keeps "
                    "only the second: rename or remove one"
                )
            first_line[key.value] = key.lineno
