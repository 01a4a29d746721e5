"""The few lines `jaxformer-train` logs when a run ends: how far it got and how long it took, its
best validation BLEU, where its checkpoints are, and the command that translates with them.

Everything about checkpoints is read back from the workdir (RunDirectory's layout), so the
summary also covers what earlier runs in the same workdir left there.
"""

from __future__ import annotations

import logging
import pathlib
import shlex
import signal
from typing import Any

import ml_collections

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import steps_past_final_choice
from jaxformer.training import text_sides
from jaxformer.training.metrics import perplexity_text

logger = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    """35.2 s, 12 min 05 s, 2 h 03 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _steps(directory: pathlib.Path) -> list[int]:
    if not directory.is_dir():
        return []
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        return checkpointer.steps()
    finally:
        checkpointer.close()


def best_checkpoint(run: RunDirectory) -> tuple[int, float | None] | None:
    """(step, validation BLEU) of the checkpoint in `best/`; None when there is none. The BLEU is
    None when the checkpoint's metadata cannot be read."""
    if not run.best.is_dir():
        return None
    checkpointer = Checkpointer(run.best, read_only=True)
    try:
        steps = checkpointer.steps()
        if not steps:
            return None
        try:
            return steps[-1], checkpointer.read_metadata(steps[-1]).bleu
        except CheckpointError as error:
            logger.warning("%s", error)
            return steps[-1], None
    finally:
        checkpointer.close()


def _step_list(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(map(str, steps))}"


def translate_command(config: ml_collections.ConfigDict, run: RunDirectory, checkpoint: str) -> str:
    """The shell command translating a file of source sentences with the run's `checkpoint`."""
    data = config.data
    flags = ["--workdir", shlex.quote(str(run.path))]
    if checkpoint != "latest":  # jaxformer-translate's default
        flags += ["--checkpoint", checkpoint]
    return " ".join(
        ["jaxformer-translate", *flags, "<", f"input.{data.source_language}", ">", f"output.{data.target_language}"]
    )


def run_summary(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, last: dict[str, Any], seconds: float):
    """The summary of a run that `train_and_evaluate(config, workdir)` ended with `last`, after
    `seconds` of wall time, as lines of text."""
    run = RunDirectory(pathlib.Path(workdir).absolute())
    training = config.training
    final, first = last["step"], last.get("first_step", 0)
    progress = f"{final - first} steps ({first} -> {final} of {training.num_train_steps}) in {format_duration(seconds)}"
    if last.get("shortened_by"):  # resumed with its length or budget shortened to (or past) the step trained to
        progress = (
            f"0 steps: {last['shortened_by']}, shortened on resume, ends the run at step {final}, already trained "
            f"({format_duration(seconds)})"
        )
    if last.get("stopped_by_signal"):
        name = signal.Signals(last["stopped_by_signal"]).name
        lines = [f"run stopped by {name}: {progress}; run the same command to resume"]
    else:
        lines = [f"run finished: {progress}"]

    architecture = text_sides.architecture(config)
    if "eval" in last:
        figures = {
            key: float(value) for key, value in last["eval"].items() if key in ("loss", "perplexity", "accuracy")
        }
        scores = f"loss {figures['loss']:.4f}, perplexity {perplexity_text(figures['perplexity'])}"
        if architecture == "encoder_only":
            scores += f", masked-token accuracy {figures['accuracy']:.4f}"
        evaluated = last.get("eval_step", final)  # a run stopped between evaluations: its last one's
        lines.append(f"validation{'' if evaluated == final else f' at step {evaluated}'}: {scores}")
    best = best_checkpoint(run)
    # best/ at step 0: a fine-tuning run's start, measured before its first step, that no step beat.
    best_is_the_start = best is not None and best[0] == 0
    if best is not None and best[1] is not None:
        start = ", the start (training.init_from): no step scored higher" if best_is_the_start else ""
        lines.append(f"best validation BLEU: {best[1]:.2f} at step {best[0]}{start}")
    elif not training.bleu_every_steps and architecture == "encoder_decoder":
        lines.append("validation BLEU: not measured (set training.bleu_every_steps to measure it)")
    if "final" in last and last["final"].get("chosen"):
        chosen = last["final"]
        alpha = "" if chosen.get("alpha") is None else f", alpha {chosen['alpha']:g}"
        start = " (the start, step 0)" if chosen["chosen"] == "best" and best_is_the_start else ""
        lines.append(
            f"final choice: {chosen['chosen']}{start}{alpha} (validation BLEU {chosen['bleu']:.2f}), in {run.final}"
        )
    if last.get("ended_by") == "time budget":
        # The budget that ended it, which a finished run started again with another (or none) keeps.
        minutes = last.get("time_budget_minutes", training.time_budget_minutes)
        lines.append(f"ended by its time budget of {minutes:g} minutes" if minutes else "ended by its time budget")

    places = []
    latest = _steps(run.checkpoints)
    if latest:
        places.append(f"latest {run.checkpoints} ({_step_list(latest)})")
    if best is not None:
        places.append(f"best {run.best} (step {best[0]})")
    averaged = _steps(run.averaged)
    if averaged:
        places.append(f"averaged {run.averaged} ({_step_list(averaged)})")
    final_steps = _steps(run.final)
    trained_past = steps_past_final_choice(run, final_steps[-1]) if final_steps else []
    if trained_past:  # translate warns of such a choice: another checkpoint is suggested below
        places.append(
            f"final {run.final} (step {final_steps[-1]}; the run trained past it, to step {trained_past[-1]})"
        )
    elif final_steps:
        places.append(f"final {run.final} (step {final_steps[-1]})")
    if not places:
        lines.append(f"checkpoints: none saved in {run.path}")
        return lines
    lines.append("checkpoints: " + "; ".join(places))
    lines.append(f"metrics: {run.metrics_file}, tensorboard --logdir {shlex.quote(str(run.tensorboard_dir))}")
    chosen = final_steps and not trained_past
    checkpoint = "final" if chosen else "best" if best is not None else "latest" if latest else "averaged"
    if architecture == "encoder_decoder":
        lines.append("translate: " + translate_command(config, run, checkpoint))
    elif architecture == "decoder_only":
        workdir = shlex.quote(str(run.path))
        lines.append(f"generate: jaxformer-generate --workdir {workdir} < prompts.{config.data.target_language}")
    else:
        flag = shlex.quote(f"--config.training.init_encoder_from={run.path}")
        lines.append(f"start a translator's encoder: {flag}")
    return lines
