"""A sweep's rows: what a variant's finished runs scored, read from their last metrics.

`finished_result` reads a run's last_metrics.json once its final choice is made and scored (a
damaged one refused, naming the file, before anything trains); `result_row` makes a seed's row of
it, and `seeds_row` the variant's row from its seeds' rows: the scores their means, the seeds' own
rows kept beside. jaxformer-sweep writes the rows to sweep.jsonl and ranks them in sweep.md.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ml_collections

from jaxformer.errors import UserError
from jaxformer.files import read_json_object
from jaxformer.run.directory import RunDirectory
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.final_choice import CANDIDATES, SCORES
from jaxformer.training.sweep_validation import validation_record

if TYPE_CHECKING:  # the rows are made by sweep.py, which imports this module
    from jaxformer.training.sweep import Variant


def finished_result(workdir: pathlib.Path) -> dict[str, Any] | None:
    """The run's last metrics when its final choice is made and scored, else None."""
    path = RunDirectory(workdir).last_metrics_file
    if path.is_dir():  # found before anything trains (sweep_checks), not once the run has trained
        raise UserError(f"{path} is a folder, where the run writes its last metrics: move it away")
    if not path.is_file():
        return None
    last = read_json_object(path)
    problem = None if last is None else _last_metrics_problem(last)
    if last is None or not isinstance(last.get("final", {}), dict) or problem:
        raise UserError(
            f"{path} is damaged (not a run's last metrics{problem or ''}): remove it, and the sweep runs that "
            "variant's run again, which finds its steps and final choice saved and writes the file anew"
        )
    return last if "bleu" in last.get("final", {}) else None


def _last_metrics_problem(last: dict[str, Any]) -> str | None:
    """'; its KEY is VALUE, not ...' for the first value of a finished run's last metrics that its
    row (`result_row`) could not take, or None: read before anything trains, not as a traceback (or a
    row that sweep.jsonl then refuses) once earlier variants have trained."""
    final = last.get("final", {})
    if not isinstance(final, dict) or "bleu" not in final:
        return None

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    for key, value, kind in (
        ("step", last.get("step"), "an integer"),
        ("train_seconds", last.get("train_seconds"), "a finite number"),
        ("final.bleu", final.get("bleu"), "a finite number"),
    ):
        if not number(value) or (kind == "an integer" and not isinstance(value, int)):
            return f"; its {key} is {value!r}, not {kind}"
    if not isinstance(final.get("chosen"), str):
        return f"; its final.chosen is {final.get('chosen')!r}, not a string"
    scores = ("alpha", "lowercase_bleu", "chrf", *(f"{name}/{score}" for name in CANDIDATES for score in SCORES))
    for key in scores:
        if final.get(key) is not None and not number(final[key]):
            return f"; its final.{key} is {final[key]!r}, not a finite number or null"
    return None


def result_row(
    variant: Variant, last: dict[str, Any], config: ml_collections.ConfigDict, pace: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The row of a run trained with `config`: its scores, and which validation pairs gave them."""
    final = last["final"]
    row = {
        "variant": variant.name,
        "changes": variant.changes(),
        "steps": last["step"],
        "speed": None if pace is None else pace["speed"],  # steps a second over the reference's
        "train_minutes": last["train_seconds"] / 60,
        "chosen": final["chosen"],
        "bleu": final["bleu"],
        # Absent only when the choice was made by an earlier process that did not live to write them.
        "alpha": final.get("alpha"),  # None: a run from before the final choice kept its alpha
        "lowercase_bleu": final.get("lowercase_bleu", final.get(f"{final['chosen']}/lowercase_bleu")),
        "chrf": final.get("chrf", final.get(f"{final['chosen']}/chrf")),
        # What a later invocation checks the row against its variants' by, the run's folder gone or not.
        "validation": validation_record(with_absolute_paths(config).to_dict()),
    }
    row.update({f"{name}_bleu": final.get(f"{name}/bleu") for name in CANDIDATES})
    return row


MEAN_KEYS = ("train_minutes", "bleu", "lowercase_bleu", "chrf", *(f"{name}_bleu" for name in CANDIDATES))


def seeds_row(seed_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One variant's row from its seeds' rows: each score the seeds' mean (None where a seed lacks
    it), the steps' mean, the seeds' own rows under "seeds" and their BLEU under "seed_bleus"."""
    if len(seed_rows) == 1:
        return {**seed_rows[0], "seed_bleus": [seed_rows[0]["bleu"]]}

    def mean(values):
        return None if any(value is None for value in values) else sum(values) / len(values)

    # The seeds share their validation pairs (sweep_validation refuses seeds that would not): seed 0's record.
    row = {key: seed_rows[0].get(key) for key in ("variant", "changes", "speed", "validation")}
    row["steps"] = round(mean([seed["steps"] for seed in seed_rows]))
    # .get: a row written before a candidate existed (a sweep resumed across versions) lacks its score.
    row.update({key: mean([seed.get(key) for seed in seed_rows]) for key in MEAN_KEYS})
    row["chosen"] = ", ".join(seed["chosen"] for seed in seed_rows)
    row["alpha"] = None  # each seed chose its own: under "seeds"
    row["seed_bleus"] = [seed["bleu"] for seed in seed_rows]
    row["seeds"] = list(seed_rows)
    return row
