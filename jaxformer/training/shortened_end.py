"""The last step's work of a run resumed to end at the step of a checkpoint not saved as its run's
last (resumed_end.py), its length or budget shortened, or its budget spent there: an interim one
(saved to stop between scheduled steps), or a scheduled one before the end its run was heading
for, or once its budget had run out before the check that would have ended it (a kill came after).

Before the checkpoint is made the run's last in place, that step's evaluation and validation
BLEU are due. metrics.jsonl may hold them already: the run was stopped right after them (they
were due at that step), or a kill came between them and the checkpoint's new metadata. A record
of the step is reused where it is complete and was measured with the settings the run has now;
else the work is done again, and the earlier record moved to metrics.rolled_back.jsonl.

What the records were measured with is what the checkpoint's config says: the process that
wrote them saved the checkpoint, or resumed from it and replaced its metadata last. A run that
measures again with other settings first moves the records it replaces aside, then gives the
checkpoint its config, so that a kill at any point leaves no record attributed to settings it
was not measured with.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.training.metrics import metric_names, perplexity_text
from jaxformer.training.periodic import Periodic, itstime, run_due
from jaxformer.training.resume_rules import kept_setting_values
from jaxformer.training.validation_bleu import BLEU_KEYS, bleu_measured_alike

logger = logging.getLogger(__name__)

# The work a record can stand for: its record's own key (as LOGGED_FIGURES tells them apart), and
# the config keys that change what it measures: which pairs, how many, which search.
REUSABLE_WORK = {
    "evaluate": ("eval/loss", ("data.eval_split", "data.max_eval_examples")),
    "bleu": ("eval/bleu", BLEU_KEYS),
}


def measured_alike(name: str, made_with: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether work `name` measures the same with the config `now` as with `made_with` (configs as
    a checkpoint saves them); BLEU by the rule best/'s score is held to (a beam size under greedy
    search changes nothing; a config older than training.bleu_tokenize scored with 13a)."""
    if name == "bleu":
        return bleu_measured_alike(dict(made_with), dict(now))
    keys = REUSABLE_WORK[name][1]
    return kept_setting_values(dict(made_with), keys) == kept_setting_values(dict(now), keys)


def reusable_records(
    due: Sequence[str],
    records: Sequence[Mapping[str, Any]],
    made_with: Mapping[str, Any],
    now: Mapping[str, Any],
    best_bleu: float | None,
) -> dict[str, Mapping[str, Any]]:
    """Of the work `due` at the step, the record metrics.jsonl holds of each (`records`: the step's,
    in file order) that can stand for it: complete (a record is written whole, a torn one cut) and
    measured alike. BLEU's only where best/'s score, `best_bleu`, is the best the record says:
    when the step's parameters beat the best, a kill may have cut their save to best/ short."""
    reusable = {}
    for name in due:
        key = REUSABLE_WORK[name][0]
        record = next((record for record in reversed(records) if key in record), None)
        if record is None or not measured_alike(name, made_with, now):
            continue
        if name == "bleu" and record.get("eval/best_bleu") != best_bleu:
            continue
        reusable[name] = record
    return reusable


def _agreed(names: set[str]) -> set[str]:
    """Process 0's `names` (only process 0 reads metrics.jsonl) in every process."""
    flags = np.asarray([name in names for name in REUSABLE_WORK], np.int32)
    if jax.process_count() > 1:
        flags = np.asarray(multihost_utils.broadcast_one_to_all(flags))
    return {name for name, flag in zip(REUSABLE_WORK, flags) if flag}


def end_work(periodic: Sequence[Periodic], step: int, writer, checkpointer, saved, metadata, best_bleu) -> None:
    """Runs the work due at `step`, the run's last, that the records metrics.jsonl held of it at the
    start (`writer.records_at_start`) do not stand for; `saved`: the step's checkpoint's metadata,
    `metadata`: the run's (its config); `best_bleu`: best/'s score. The caller then makes the
    checkpoint the run's last."""
    work = [action for action in periodic if not action.saves]
    due = [
        action.name
        for action in work
        if action.name in REUSABLE_WORK and itstime(step, action.every_steps, step, action.at_last_step)
    ]
    found = reusable_records(due, writer.records_at_start, saved.config, metadata.config, best_bleu)
    reused = _agreed(set(found))
    for name, record in found.items():
        figures = {key: float(value) for key, value in record.items() if key.startswith("eval/")}
        if name == "evaluate":
            logger.info(
                "step %d: validation loss %.4f, perplexity %s, accuracy %.4f, as measured before the stop "
                "(metrics.jsonl): not measured again",
                *(step, figures["eval/loss"], perplexity_text(figures["eval/perplexity"]), figures["eval/accuracy"]),
            )
        else:
            logger.info(
                "step %d: validation BLEU %.2f, as measured before the stop: not measured again",
                step,
                figures["eval/bleu"],
            )
    measured_otherwise = {name for name in set(due) - reused if not measured_alike(name, saved.config, metadata.config)}
    if measured_otherwise:  # the records it replaces aside first, then the checkpoint's config
        keys = {REUSABLE_WORK[name][0] for name in measured_otherwise}
        for names in {metric_names(record) for record in writer.records_at_start if keys & set(record)}:
            writer.move_earlier(step, names)
        checkpointer.replace_metadata(step, saved.replace(config=metadata.config))
    run_due([action for action in work if action.name not in reused], step, step)
