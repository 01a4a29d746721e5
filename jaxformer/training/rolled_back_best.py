"""best/ after a resumed run set its step aside (run/rolled_back.py): the best of the history the
run goes on from, not nothing until the next validation BLEU.

best/ keeps one step, the best scored. A run resumed from a checkpoint older than that step (one
killed between a BLEU and the next checkpoint, or whose newest checkpoint was damaged) sets it
aside, and best/ was left empty: `--checkpoint best` refused, a run stopped or ended before its
next BLEU had no best candidate in its final choice, and that next BLEU, compared with nothing,
became "the best so far" however low, below scores metrics.jsonl keeps. The steps the run goes on
from were scored too (metrics.jsonl's eval/bleu records up to the step it resumed from), and those
with a checkpoint kept in checkpoints/ still have their parameters: the best of those, measured as
the run measures BLEU now, is written to best/ again, as BleuValidator wrote it then, and said in
one line; where there is none, one line says best/ is empty until the next BLEU, and why.
"""

from __future__ import annotations

import logging
import math

import ml_collections

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.rolled_back import rolled_back_steps, set_aside_rolled_back
from jaxformer.training.metrics import metric_records
from jaxformer.training.validation_bleu import bleu_measured_alike

logger = logging.getLogger(__name__)


def set_aside_rolled_back_keeping_best(run: RunDirectory, start_step: int, config: ml_collections.ConfigDict) -> None:
    """`set_aside_rolled_back(run, start_step)`, then, where best/ holds no step but one set aside
    after `start_step` (this start's, or an earlier one's that stopped before its next BLEU),
    `restore_best` (as where it holds only a step that does not read whole: `_holds_a_whole_step`).
    Every process decides alike from the same files and writes best/ together."""
    set_aside_rolled_back(run, start_step)
    if not run.best.is_dir() or not any(step > start_step for step in rolled_back_steps(run.best)):
        return
    if not _holds_a_whole_step(run):
        restore_best(run, start_step, config)


def _holds_a_whole_step(run: RunDirectory) -> bool:
    """Whether best/ holds a step that reads whole, the steps that do not set aside as damaged
    (`<step>.damaged-<time>`, with a warning). A run killed as it replaced best/'s step leaves the
    old step part-deleted (orbax removes it once the new one is written) beside the new one, which
    the resume sets aside: counted as held, the old step's score was lost to the next BLEU's
    comparison, and its parameters to the final choice, while its checkpoint could restore both."""
    best = Checkpointer(run.best, keep=None)
    try:
        for step in reversed(best.steps()):
            try:
                best.read_params(step)
            except CheckpointError:
                best.set_aside(step)
            else:
                return True
        return False
    finally:
        best.close()


def bleu_scores(run: RunDirectory, last_step: int) -> dict[int, float]:
    """{step: validation BLEU} that metrics.jsonl records up to `last_step` (the last record of a
    step, as its writer kept it)."""
    scores: dict[int, float] = {}
    for record in metric_records(run):
        step, bleu = record.get("step"), record.get("eval/bleu")
        if isinstance(step, int) and step <= last_step and isinstance(bleu, (int, float)) and math.isfinite(bleu):
            scores[step] = float(bleu)
    return scores


def restore_best(run: RunDirectory, start_step: int, config: ml_collections.ConfigDict) -> int | None:
    """Writes to best/ the parameters of the best-scored step up to `start_step` (`bleu_scores`;
    the earliest of a tie, as BleuValidator keeps the first) whose checkpoint in checkpoints/ is
    kept, reads, and was scored as `config` scores BLEU (`bleu_measured_alike`), with its BLEU, as
    BleuValidator saved it; its step, logged with the best score it could not restore, if any.
    None, with a warning naming why best/ stays empty until the next BLEU, where there is no such step."""
    scores = bleu_scores(run, start_step)
    reader = Checkpointer(run.checkpoints, keep=None, read_only=True)
    try:
        kept = set(reader.steps())
        restored = None
        for step in sorted((step for step in scores if step in kept), key=lambda step: (-scores[step], step)):
            try:
                if not bleu_measured_alike(reader.read_metadata(step).config, config.to_dict()):
                    continue
                restored = (step, *reader.read_params(step))
            except CheckpointError:  # damaged: the next candidate; a resume or a reader of it names the damage
                continue
            break
    finally:
        reader.close()
    best_step = min(scores, key=lambda step: (-scores[step], step)) if scores else None
    best_scored = "" if best_step is None else f" (the best: BLEU {scores[best_step]:.2f} at step {best_step})"
    if restored is None:
        if start_step < 0:
            why = "it has no checkpoint to resume from"
        elif not scores:
            why = f"none of the steps up to step {start_step} it goes on from was scored for BLEU"
        else:
            why = (
                f"none of the steps up to step {start_step} it goes on from with a checkpoint kept in checkpoints/ "
                f"was scored as BLEU is measured now{best_scored}"
            )
        logger.warning(
            "best/ holds no step until this run's next validation BLEU: %s; --checkpoint best is refused, and the "
            "final choice has no best candidate, until then",
            why,
        )
        return None
    step, metadata, params = restored
    writer = Checkpointer(run.best, keep=1)
    try:
        best = metadata.replace(
            step=step, bleu=scores[step], interim=False, train_window=None, work_seconds=None, saved_as_last=None
        )
        writer.save_params(step, params, best)
    finally:
        writer.close()
    unrestored = ""
    if step != best_step:
        unusable = "is not kept" if best_step not in kept else "is damaged or was scored as BLEU is not measured now"
        unrestored = f"; step {best_step} scored {scores[best_step]:.2f}, but its checkpoint {unusable}"
    logger.warning(
        "best/: step %d (validation BLEU %.2f) written again from its checkpoint, the best scored of the steps up to "
        "step %d this run goes on from whose parameters are kept%s",
        *(step, scores[step], start_step, unrestored),
    )
    return step
