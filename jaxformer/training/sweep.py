"""A sweep: one experiment config trained once per variant, each variant with some keys changed,
one run after another, each in its own workdir, compared on validation BLEU only.

A sweep file is a Python file whose `get_sweep()` returns {variant name: [override, ...]}, each
override written as after `--config.` on the command line ("model.dropout_rate=0.3"); a variant
with no overrides is the config as it is. Every variant is built and validated before the first
run starts. Each run ends with the final choice (training.final_choice must be on), whose
validation BLEU (beam search with the `decoding` settings, on the validation split) is the
variant's score; no test set is read. A variant whose workdir already holds that choice is not
trained again, so running the same sweep again resumes it where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxformer.model.config import ConfigError
from jaxformer.run.directory import RunDirectory
from jaxformer.training import experiment
from jaxformer.training.config_file import (
    apply_overrides,
    call_file_function,
    load_config,
    packaged_config_directory,
)
from jaxformer.training.final_choice import CANDIDATES

VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a folder name on every platform


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[tuple[str, str], ...]  # the variant's own (dotted key, value text), in order
    config: ml_collections.ConfigDict

    def changes(self) -> str:
        return ", ".join(f"{key}={text}" for key, text in self.overrides) or "(the config as it is)"


def packaged_sweep_directory() -> pathlib.Path:
    return packaged_config_directory() / "sweeps"


def sweep_path(name_or_path: str) -> pathlib.Path:
    """jaxformer/configs/sweeps/NAME.py for a name without `/` or `.py`, else the path as given."""
    if "/" in name_or_path or name_or_path.endswith(".py"):
        return pathlib.Path(name_or_path)
    names = sorted(path.stem for path in packaged_sweep_directory().glob("*.py") if not path.stem.startswith("_"))
    if name_or_path not in names:
        raise ConfigError(f"no sweep named {name_or_path!r}; jaxformer ships {', '.join(names)} (or give a .py path)")
    return packaged_sweep_directory() / f"{name_or_path}.py"


def load_sweep(name_or_path: str) -> dict[str, list[str]]:
    """{variant name: [override, ...]} from the sweep file's get_sweep()."""
    path = sweep_path(name_or_path)
    sweep = call_file_function(path, "get_sweep", "sweep file")
    if not isinstance(sweep, dict) or not sweep:
        raise ConfigError(f"sweep file {path}: get_sweep() must return a non-empty dict of variant name -> overrides")
    for name, overrides in sweep.items():
        if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name):
            raise ConfigError(f"sweep file {path}: variant name {name!r} must match {VARIANT_NAME.pattern}")
        if isinstance(overrides, str) or not all(isinstance(item, str) for item in overrides):
            raise ConfigError(f"sweep file {path}: variant {name!r} must list its overrides as strings KEY=VALUE")
    return sweep


def make_variants(
    config_name: str, sweep: dict[str, Sequence[str]], shared: Sequence[tuple[str, str]] = ()
) -> list[Variant]:
    """Each variant's config: the base config with the `shared` (key, text) overrides, then the
    variant's own, applied and every value validated."""
    variants = []
    for name, overrides in sweep.items():
        pairs = []
        for item in overrides:
            key, equals, text = item.partition("=")
            if not equals or not key.strip():
                raise ConfigError(f"variant {name!r}: override {item!r} is not KEY=VALUE (e.g. model.dropout_rate=0.3)")
            pairs.append((key.strip().removeprefix("--config."), text))
        config = load_config(config_name)
        try:
            apply_overrides(config, [*shared, *pairs])
            experiment.validate(config)
        except ConfigError as error:
            raise ConfigError(f"variant {name!r}: {error}") from None
        if not config.training.final_choice:
            raise ConfigError(
                f"variant {name!r}: training.final_choice is False; a sweep compares the final choice's "
                "validation BLEU (set --config.training.final_choice=True or use a config that does)"
            )
        variants.append(Variant(name, tuple(pairs), config))
    return variants


def finished_result(workdir: pathlib.Path) -> dict[str, Any] | None:
    """The run's last metrics when its final choice is made and scored, else None."""
    path = RunDirectory(workdir).last_metrics_file
    if not path.is_file():
        return None
    last = json.loads(path.read_text(encoding="utf-8"))
    return last if "bleu" in last.get("final", {}) else None


def result_row(variant: Variant, last: dict[str, Any]) -> dict[str, Any]:
    final = last["final"]
    row = {
        "variant": variant.name,
        "changes": variant.changes(),
        "steps": last["step"],
        "train_minutes": last["train_seconds"] / 60,
        "chosen": final["chosen"],
        "bleu": final["bleu"],
        # Absent only when the choice was made by an earlier process that did not live to write them.
        "alpha": final.get("alpha"),  # None: a run from before the final choice kept its alpha
        "lowercase_bleu": final.get("lowercase_bleu", final.get(f"{final['chosen']}/lowercase_bleu")),
        "chrf": final.get("chrf", final.get(f"{final['chosen']}/chrf")),
    }
    row.update({f"{name}_bleu": final.get(f"{name}/bleu") for name in CANDIDATES})
    return row


def run_sweep(variants: Sequence[Variant], workdir: str | pathlib.Path) -> tuple[list[dict[str, Any]], int | None]:
    """Trains each variant not yet finished in workdir/<name>, in order; (the rows of the finished
    variants, the signal that stopped a run, or None)."""
    from jaxformer.training.loop import train_and_evaluate

    workdir = pathlib.Path(workdir)
    rows = []
    for index, variant in enumerate(variants, 1):
        run_dir = workdir / variant.name
        last = finished_result(run_dir)
        if last is None:
            logging.info("sweep: variant %d of %d, %s: %s", index, len(variants), variant.name, variant.changes())
            last = train_and_evaluate(variant.config, str(run_dir))
            if last.get("stopped_by_signal"):
                return rows, last["stopped_by_signal"]
            last = finished_result(run_dir)
        else:
            logging.info("sweep: variant %s already finished in %s", variant.name, run_dir)
        rows.append(result_row(variant, last))
    return rows, None


def results_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of the rows, highest validation BLEU first."""

    def number(value, digits=2):
        return "" if value is None else f"{value:.{digits}f}"

    lines = [
        "| variant | changes | steps | train minutes | validation BLEU | chosen | alpha | latest | best | averaged |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in sorted(rows, key=lambda row: -row["bleu"]):
        alpha = "" if row.get("alpha") is None else f"{row['alpha']:g}"
        lines.append(
            f"| {row['variant']} | {row['changes']} | {row['steps']:,} | {number(row['train_minutes'], 1)} "
            f"| **{number(row['bleu'])}** | {row['chosen']} | {alpha} "
            f"| {number(row['latest_bleu'])} "
            f"| {number(row['best_bleu'])} | {number(row['averaged_bleu'])} |"
        )
    return "\n".join(lines) + "\n"
