"""A sweep's pace records under `--baseline_steps`: each variant's speed relative to the
reference config's, measured (pace.py) before its first run trains and kept in
WORKDIR/pace/<variant>.json, so that its resumes train for the steps it started with."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import ml_collections

from jaxformer.errors import UserError
from jaxformer.files import read_json_object, write_text_atomically
from jaxformer.run.directory import SweepDirectory
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.pace import Pace, relative_pace

if TYPE_CHECKING:  # sweep.py builds on this module
    from jaxformer.training.sweep import Variant

PACE_FIELDS = {"baseline_steps": int, "steps": int, "speed": (int, float)}  # what a sweep reads of a pace record


def pace_file(workdir: pathlib.Path, variant: Variant) -> pathlib.Path:
    return SweepDirectory(workdir).pace_dir / f"{variant.name}.json"


def stored_pace(path: pathlib.Path) -> dict[str, Any] | None:
    """The pace record an earlier process wrote for a variant, or None; a damaged one is an error
    naming it."""
    if not path.is_file():
        return None
    record = read_json_object(path)
    if (
        record is None
        or not all(
            isinstance(record.get(key), kind) and not isinstance(record[key], bool) for key, kind in PACE_FIELDS.items()
        )
        or not isinstance(record.get("changes", ""), str)  # absent from a record written before it was kept
        or not isinstance(record.get("config", {}), dict)
    ):
        raise UserError(
            f"{path} is damaged (not a pace record with {', '.join(PACE_FIELDS)}): remove it to measure the "
            "variant's pace again, and the variant's runs with it, if any (they trained for the steps it held)"
        )
    return record


def variant_pace(
    variant: Variant,
    reference: ml_collections.ConfigDict,
    baseline_steps: int,
    path: pathlib.Path,
    stored: dict[str, Any] | None,
    check_signals: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The variant's pace record: `stored` when an earlier process measured it (a resumed
    variant keeps its step budget; sweep_checks refused one for another --baseline_steps), else
    measured against `reference` (`check_signals` between its steps) and written to `path`."""
    if stored is not None:
        return stored
    if not variant.overrides:
        pace = Pace(1.0, 1.0, timed=False)
    else:
        pace = relative_pace(variant.config, reference, check_signals)
    record = {"baseline_steps": baseline_steps, "steps": pace.steps_for(baseline_steps), "speed": pace.speed}
    # What it was measured for: an edited variant's, or one under other --config values, is not its pace (sweep_checks).
    record.update(changes=variant.changes(), config=with_absolute_paths(variant.config).to_dict())
    record.update(dataclasses.asdict(pace))
    if jax.process_index() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(record) + "\n")
    return record
