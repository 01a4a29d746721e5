"""The run's final model, chosen at its end (training.final_choice): the latest parameters, the
best by validation BLEU during training (workdir/best), or the mean of the last checkpoints
(training.average_last of them), whichever translates the validation split (data.max_eval_examples
of it, when set) best with the
config's decoding (beam 4 by default). Saved as workdir/final/<step> (`--checkpoint final`), its
metadata naming the candidate and its BLEU; no test data is read."""

from __future__ import annotations

import logging
import time
from typing import Any

import ml_collections

from jaxformer.errors import CheckpointError
from jaxformer.model.config import TransformerConfig
from jaxformer.run.averaging import averaged_last
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_from_directory
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training.run_tokenizer import RunTokenizers
from jaxformer.training.validation_bleu import ValidationSet

CANDIDATES = ("latest", "best", "averaged")  # in this order; a tie goes to the first


def _candidates(run: RunDirectory, average_last: int, step: int, params: Any, metadata: CheckpointMetadata):
    """{name: (metadata, params)}: the latest parameters, best/'s when they are another step's,
    and the mean of the last `average_last` checkpoints (of those kept, at least two)."""
    candidates = {"latest": (metadata, params)}
    if run.best.is_dir():
        try:
            best_step, best_metadata, best_params = load_from_directory(run.best)
        except CheckpointError as error:
            logging.warning("final choice: %s; best/ is not a candidate", error)
        else:
            if best_step != step:  # at the last step best/ holds the latest parameters
                candidates["best"] = (best_metadata, best_params)
    reader = Checkpointer(run.checkpoints, keep=None, read_only=True)
    kept = len(reader.steps())
    reader.close()
    if min(average_last, kept) >= 2:
        candidates["averaged"] = averaged_last(run, min(average_last, kept))
    return candidates


def choose_final(
    config: ml_collections.ConfigDict,
    model_config: TransformerConfig,
    tokenizers: RunTokenizers,
    eval_source,
    run: RunDirectory,
    step: int,
    params: Any,
    metadata: CheckpointMetadata,
) -> dict[str, Any]:
    """Scores the candidates on the whole validation split, saves the highest to workdir/final;
    returns {"chosen": name, "<name>/bleu": ..., "<name>/chrf": ..., ...}. A run that already
    chose at this step (a finished run started again) keeps its choice."""
    writer = Checkpointer(run.final, keep=1)
    try:
        if step in writer.steps():
            chosen = writer.read_metadata(step)
            logging.info("final choice: already made at step %d (%s)", step, chosen.chosen_from)
            return {"chosen": chosen.chosen_from, "bleu": chosen.bleu}
        started = time.monotonic()
        examples = config.data.max_eval_examples or 0  # the pairs the run validates on (0: all)
        validation = ValidationSet(config, model_config, tokenizers.source, eval_source, examples, tokenizers.target)
        candidates = _candidates(run, config.training.average_last, step, params, metadata.replace(step=step))
        summary: dict[str, Any] = {}
        for name, (_, candidate_params) in candidates.items():
            scores = validation.score(candidate_params)
            summary.update({f"{name}/{key}": scores[key] for key in ("bleu", "lowercase_bleu", "chrf")})
        chosen = max(candidates, key=lambda name: (summary[f"{name}/bleu"], -CANDIDATES.index(name)))
        chosen_metadata, chosen_params = candidates[chosen]
        writer.save_params(
            step,
            chosen_params,
            chosen_metadata.replace(step=step, bleu=summary[f"{chosen}/bleu"], chosen_from=chosen),
        )
        logging.info(
            "final choice at step %d, validation BLEU on %d sentences: %s; chose %s (saved to %s) in %.0f s",
            step,
            len(validation.sources),
            ", ".join(f"{name} {summary[f'{name}/bleu']:.2f}" for name in candidates),
            chosen,
            run.final,
            time.monotonic() - started,
        )
        return {"chosen": chosen, "bleu": summary[f"{chosen}/bleu"], **summary}
    finally:
        writer.close()
