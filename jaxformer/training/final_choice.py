"""The run's final model, chosen at its end (training.final_choice): the latest parameters, the
best by validation BLEU during training (workdir/best), the mean of the last checkpoints
(training.average_last of them), or the parameters' moving average (optimizer.ema_decay, when set),
whichever translates the validation split (data.max_eval_examples of it, when set) best with the
config's decoding (beam 4 by default). Then, when training.final_alphas lists length penalties,
the chosen parameters are translated with each and the highest-scoring alpha is kept with them
(decoding.alpha on a tie): a model trained for an hour on a small corpus writes short outputs,
and the paper's 0.6 was chosen for WMT. Saved as workdir/final/<step> (`--checkpoint final`), its
metadata naming the candidate, its alpha (under beam search, decoding.alpha when it compared none;
greedy search and sampling read none) and its BLEU (and its config the search: the length penalty's
form, decoding.length_penalty, and decoding.renormalize_after_bans); translate, evaluate and export
use that alpha unless --alpha is given, that form unless --length_penalty is, and that
renormalisation unless --renormalize_after_bans is. No test data is read."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from jaxformer.errors import CheckpointError, UserError
from jaxformer.model.config import TransformerConfig
from jaxformer.run.averaging import averaged_last
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_from_directory
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import resume_rules
from jaxformer.training.run_tokenizer import RunTokenizers
from jaxformer.training.validation_bleu import BEAM_ONLY_KEYS, SEARCH_KEYS, ValidationSet, bleu_settings

logger = logging.getLogger(__name__)

CANDIDATES = ("latest", "best", "averaged", "ema")  # in this order; a tie goes to the first
SCORES = ("bleu", "lowercase_bleu", "chrf")  # kept per candidate and per alpha
# The config keys a choice depends on besides the run itself: which candidates, which validation
# pairs, which search (decoding.batch_size too: padding moves a float or two), which alphas, which
# BLEU tokenizer.
CHOICE_KEYS = (
    "training.average_last",
    "training.final_alphas",
    "training.bleu_tokenize",
    "data.eval_split",
    "data.max_eval_examples",
    *SEARCH_KEYS,
    "decoding.batch_size",
)


def run_config_differences(config: dict[str, Any], newest: dict[str, Any]) -> list[str]:
    """'key: value -> newest's' for each config value that makes a checkpoint's run another than the
    newest checkpoint's: what a run resumed from its workdir may not change (resume_rules), for
    averaging (run/averaging.py)."""
    return resume_rules.resume_differences(config, ml_collections.ConfigDict(newest))


def _choice_values(config: dict[str, Any]) -> dict[str, Any]:
    """The CHOICE_KEYS values of a config; a key it lacks has its default, as the run that lacked it
    had (a length penalty or renormalisation the run's start did not settle, or that a run before
    the key lacks: gnmt, False); the BLEU tokenizer the one it scores with: as validation BLEU reads
    them (bleu_settings)."""
    return bleu_settings(config, CHOICE_KEYS)


def _choice_settings(values: dict[str, Any], kept: int) -> dict[str, Any]:
    """`_choice_values`' `values` as far as they change the choice: final_alphas and BEAM_ONLY_KEYS
    only for beam search, which alone reads them, and average_last as the number averaged of the
    `kept` checkpoints."""
    settings = dict(values)
    if settings["decoding.method"] != "beam":
        settings["training.final_alphas"] = ()
        settings.update(dict.fromkeys(BEAM_ONLY_KEYS))
    averaged = min(settings["training.average_last"], kept)
    settings["training.average_last"] = averaged if averaged >= 2 else 0
    return settings


def _refuse_other_settings(config: ml_collections.ConfigDict, run: RunDirectory, step: int, chosen) -> None:
    """A UserError when the choice kept at `step` was made with other CHOICE_KEYS values than
    `config` has: the same command again would report it as if made with these."""
    reader = Checkpointer(run.checkpoints, keep=None, read_only=True)
    kept = len(reader.steps())
    reader.close()
    was, current = _choice_values(chosen.config), _choice_values(config.to_dict())
    made_with, now = _choice_settings(was, kept), _choice_settings(current, kept)
    if made_with != now:
        # the keys changed: final_alphas unchanged but read no more under greedy search is not one
        named = resume_rules.changed_settings(CHOICE_KEYS, was, current, made_with, now)
        raise UserError(
            f"the final choice in {run.final / str(step)} was made with {named}; it stays as it is: to choose "
            f"again with the settings now, move {run.final} aside (e.g. to {run.final}.before), then run the same "
            "command again; or run with the settings it was made with"
        )


def check_kept_choice(config: ml_collections.ConfigDict, run: RunDirectory, step: int, train_seconds: float) -> None:
    """Before anything is prepared: a run resumed at `step` that trains no further (its steps or
    its time budget spent) and already chose there is held to that choice's settings, as
    `choose_final` holds it when it gets there, so that a refusal costs no data or compilation."""
    if not config.training.final_choice or resume_rules.trains_further(config.training, step, train_seconds):
        return
    chosen = _saved_metadata(run, step)
    if chosen is not None:
        _refuse_other_settings(config, run, step, chosen)


def saved_choice(run: RunDirectory, step: int) -> dict[str, Any] | None:
    """The final choice at `step` as `choose_final` returns it, read from workdir/final; None when
    none is saved there, whole."""
    chosen = _saved_metadata(run, step)
    return None if chosen is None else _as_result(chosen)


def _saved_metadata(run: RunDirectory, step: int) -> CheckpointMetadata | None:
    """The metadata of the final choice saved, whole, at `step` in workdir/final; None without one
    or when it cannot be read."""
    if not (run.final / str(step)).is_dir():
        return None
    reader = Checkpointer(run.final, keep=None, read_only=True)
    try:
        return reader.read_metadata(step) if step in reader.steps() else None
    except CheckpointError:  # damaged: `choose_final` sets it aside and chooses again
        return None
    finally:
        reader.close()


def _verified_choice(writer: Checkpointer, step: int) -> CheckpointMetadata | None:
    """The metadata of the choice kept at `step`, once its parameters match their checksums; None
    when it is damaged, then set aside (`<step>.damaged-<time>`, as a damaged checkpoint is when
    training resumes) for the choice to be made again: its report would hold for parameters that
    `--checkpoint final` cannot read."""
    try:
        return writer.read_params(step)[0]
    except CheckpointError as error:
        logger.warning("final choice: the one made at step %d is damaged (%s); making it again", step, error)
        writer.set_aside(step)
        return None


def _as_result(chosen: CheckpointMetadata) -> dict[str, Any]:
    return {"chosen": chosen.chosen_from, "alpha": chosen.alpha, "bleu": chosen.bleu, **(chosen.choice_scores or {})}


def _candidates(
    run: RunDirectory, average_last: int, step: int, params: Any, metadata: CheckpointMetadata, ema_params: Any
):
    """{name: (metadata, params)}: the latest parameters, best/'s when they are another step's,
    the mean of the last `average_last` checkpoints (of those kept, at least two), and the moving
    average `ema_params` when not None."""
    candidates = {"latest": (metadata, params)}
    if run.best.is_dir():
        try:
            best_step, best_metadata, best_params = load_from_directory(run.best)
        except CheckpointError as error:
            logger.warning("final choice: %s; best/ is not a candidate", error)
        else:
            if best_step != step:  # at the last step best/ holds the latest parameters
                candidates["best"] = (best_metadata, best_params)
    reader = Checkpointer(run.checkpoints, keep=None, read_only=True)
    kept = len(reader.steps())
    reader.close()
    if 0 < kept < average_last:  # a run that ended before it had written average_last checkpoints
        logger.warning(
            "final choice: the run has %d checkpoint(s), fewer than training.average_last=%d; %s",
            kept,
            average_last,
            f"the average is of those {kept}" if kept >= 2 else "no average is a candidate",
        )
    if min(average_last, kept) >= 2:
        try:
            candidates["averaged"] = averaged_last(run, min(average_last, kept), run_config_differences)
        except CheckpointError as error:  # a checkpoint of another run in checkpoints/, as best/ above
            logger.warning("final choice: %s; no average is a candidate", error)
    if ema_params is not None:
        candidates["ema"] = (metadata, ema_params)
    return candidates


def _choose_alpha(
    validation: ValidationSet,
    params: Any,
    alphas: Sequence[float],
    scores_at_default: dict[str, Any],
    check: Callable[[], None],
) -> tuple[float, dict[float, dict[str, Any]]]:
    """(the alpha among decoding.alpha and `alphas` whose translations of the validation split
    score the highest BLEU, {alpha: scores}); decoding.alpha wins a tie, then the earlier in `alphas`.
    `check()` after each scoring (choose_final's)."""
    scores = {validation.settings.alpha: scores_at_default}
    for alpha in alphas:
        if alpha not in scores:
            settings = dataclasses.replace(validation.settings, alpha=float(alpha))
            scores[alpha] = validation.with_settings(settings).score(params)
            check()
    return max(scores, key=lambda alpha: scores[alpha]["bleu"]), scores  # max keeps the first of equals


def choose_final(
    config: ml_collections.ConfigDict,
    model_config: TransformerConfig,
    tokenizers: RunTokenizers,
    eval_source,
    run: RunDirectory,
    step: int,
    params: Any,
    metadata: CheckpointMetadata,
    ema_params: Any = None,
    check: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Scores the candidates on the whole validation split, then the chosen one with each of
    training.final_alphas, and saves it to workdir/final (`ema_params`: the optimizer's moving average
    of the parameters, a candidate when given); returns {"chosen": name, "alpha": ...,
    "bleu": ..., "<name>/bleu": ..., "<name>/chrf": ..., "alpha_<alpha>/bleu": ..., ...}. A run that already
    chose at this step (a finished run started again) keeps its choice, once its parameters are
    verified (a damaged one is set aside and the choice made again); a UserError when that
    choice was made with other settings (CHOICE_KEYS) than `config` has, or when a file lies at
    workdir/best or workdir/final. `check()` is called after each scoring: where a stop that
    every process must agree on (final_choice_stop.py) stops the choice."""
    run.check_folders("best", "final")  # before any scoring: a file at best/ is no candidate to drop quietly
    made_final_dir = not run.final.exists()  # removed again if the choice is stopped before it saves
    writer = Checkpointer(run.final, keep=None)  # an earlier choice (a run continued past its end) stays
    try:
        chosen = _verified_choice(writer, step) if step in writer.steps() else None
        if chosen is not None:
            _refuse_other_settings(config, run, step, chosen)
            logger.info("final choice: already made at step %d (%s)", step, chosen.chosen_from)
            return _as_result(chosen)
        earlier = writer.steps()
        if earlier:
            logger.info(
                "final choice: the choices made at step(s) %s stay in %s; --checkpoint final reads the newest",
                ", ".join(map(str, earlier)),
                run.final,
            )
        started = time.monotonic()
        examples = config.data.max_eval_examples or 0  # the pairs the run validates on (0: all)
        validation = ValidationSet(config, model_config, tokenizers.source, eval_source, examples, tokenizers.target)
        candidates = _candidates(
            run, config.training.average_last, step, params, metadata.replace(step=step), ema_params
        )
        summary: dict[str, Any] = {}
        candidate_scores = {}
        for name, (_, candidate_params) in candidates.items():
            candidate_scores[name] = validation.score(candidate_params)
            check()
            summary.update({f"{name}/{key}": candidate_scores[name][key] for key in SCORES})
        chosen = max(candidates, key=lambda name: (summary[f"{name}/bleu"], -CANDIDATES.index(name)))
        chosen_metadata, chosen_params = candidates[chosen]
        # Length penalties rank beam search's hypotheses only (unused_settings says so).
        alphas = config.training.final_alphas if config.decoding.method == "beam" else ()
        alpha, scores = _choose_alpha(validation, chosen_params, alphas, candidate_scores[chosen], check)
        if alphas:
            summary.update({f"alpha_{value:g}/{key}": scores[value][key] for value in scores for key in SCORES})
        result = {
            "chosen": chosen,
            # The alpha every score of the choice was measured with, compared or not: the one
            # `--checkpoint final` searches with. A greedy search or sampling reads none.
            "alpha": alpha if config.decoding.method == "beam" else None,
            **{key: scores[alpha][key] for key in SCORES},
            **summary,
        }
        writer.save_params(
            step,
            chosen_params,
            chosen_metadata.replace(
                config=config.to_dict(),  # the settings of this choice (best/'s may be of a resume's start)
                step=step,
                bleu=result["bleu"],
                chosen_from=chosen,
                alpha=result["alpha"],
                choice_scores={key: value for key, value in result.items() if key not in ("chosen", "alpha", "bleu")},
            ),
        )
        by_alpha = ""  # a greedy or sampled search compares no alpha
        if alphas:
            tried = ", ".join(f"{value:g} {scores[value]['bleu']:.2f}" for value in scores)
            form = validation.settings.length_penalty
            by_alpha = f"; by alpha ({form} length penalty): {tried}; chose alpha {alpha:g}"
        logger.info(
            "final choice at step %d, validation BLEU on %d sentences: %s; chose %s%s (saved to %s) in %.0f s",
            step,
            len(validation.sources),
            ", ".join(f"{name} {summary[f'{name}/bleu']:.2f}" for name in candidates),
            chosen,
            by_alpha,
            run.final,
            time.monotonic() - started,
        )
        if chosen == "best" and chosen_metadata.step == 0:  # only a fine-tuning run measures its start's BLEU
            logger.warning(
                "final choice: best/ holds the start (step 0: the parameters of training.init_from=%s), which "
                "scored higher on the validation split than every candidate this run trained; %s holds the "
                "starting parameters",
                config.training.init_from,
                run.final,
            )
        return result
    finally:
        writer.close()
        if made_final_dir and run.final.is_dir() and not any(run.final.iterdir()):
            with contextlib.suppress(OSError):  # another process of the run removed it first
                run.final.rmdir()
