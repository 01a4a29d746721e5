"""train_and_evaluate(config, workdir): the whole training run, resumable from its workdir.

In order: check the config, take the workdir (taken_workdir.py), then (run_start.py) compare with
the run already there and prepare the data, the tokenizers and the model; here, restore or
initialise the state, then train with the periodic work (log, evaluate, BLEU, checkpoint)
scheduled by `periodic.itstime`, and make the final choice.
"""

from __future__ import annotations

import functools
import logging
import pathlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from jaxformer.data.parallel_text import DataError
from jaxformer.errors import UserError, exit_code_for_signal
from jaxformer.model.architectures import build_model
from jaxformer.run.directory import RunDirectory
from jaxformer.run.event_loops import draining_event_loops
from jaxformer.training import experiment, processes, run_start, sharding, shortened_end
from jaxformer.training.budget import TimeBudget, TrainingClock
from jaxformer.training.budget_check import (
    BUDGET_CHECK_STEPS,
    HeldRecord,
    budget_check_due,
    check_budget,
    spent_by_work,
)
from jaxformer.training.budget_resume import end_at_resume
from jaxformer.training.config_file import holds_numpy_scalars, with_python_values
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.end_signals import stopped_before_the_final_choice, with_late_signal
from jaxformer.training.final_choice import choose_final
from jaxformer.training.final_choice_stop import choose_unless_stopped
from jaxformer.training.init_from import refuse_missing_starts, starting_overrides, with_overrides
from jaxformer.training.kept_checkpoints import remove_beyond_keep
from jaxformer.training.metrics import MetricWriter, perplexity_text, summarize, write_last_metrics_in_process_0
from jaxformer.training.objectives import objective_for
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.parameter_ema import parameter_ema, restart_parameter_ema
from jaxformer.training.periodic import Periodic, run_at_start, run_due
from jaxformer.training.rdrop_start import RDropPhase
from jaxformer.training.resumed_end import resumed_end
from jaxformer.training.rolled_back_best import set_aside_rolled_back_keeping_best
from jaxformer.training.run_batches import run_batches
from jaxformer.training.run_saves import RunSaver
from jaxformer.training.run_start import PreparedRun
from jaxformer.training.schedule_end import ScheduleEnd
from jaxformer.training.signals import RaiseOnSignal, Stopped, StopRequest
from jaxformer.training.state import count_parameters, make_init_fn
from jaxformer.training.step import make_eval_step, make_run_train_step
from jaxformer.training.step_exchange import raise_held_write, stops_after
from jaxformer.training.steps_ahead import StepsAhead
from jaxformer.training.taken_workdir import take_workdir
from jaxformer.training.train_metrics import TrainMetrics, progress_bar
from jaxformer.training.unreadable_batch import saved_before_stopping
from jaxformer.training.validation_bleu import BleuValidator

logger = logging.getLogger(__name__)


def _evaluate(eval_fn, params, batches, batch_sharding) -> dict[str, float]:
    totals = None
    for batch in batches:
        metrics = eval_fn(params, sharding.global_batch(sharding.local_rows(batch), batch_sharding))
        totals = metrics if totals is None else jax.tree.map(lambda a, b: a + b, totals, metrics)
    return summarize(jax.device_get(totals))


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    on_complete: Callable[[dict[str, Any]], None] = lambda last: None,
) -> dict[str, Any]:
    """Trains (or resumes) the experiment `config` in `workdir`; returns the last metrics
    (with "stopped_by_signal": its number, when SIGTERM or Ctrl-C stopped the run early;
    "signal_once_complete": its number, when one came once the complete run's work was done).
    `on_complete(last)` is called then, while the run's signal handlers are still in place: a
    handler it installs takes over with no moment between (end_signals.py).

    Every config value is checked before anything is written; then the workdir is locked for
    the run (one run per workdir)."""

    if holds_numpy_scalars(config):  # a library caller's: each checkpoint writes the config as JSON
        config = with_python_values(config)
    processes.all_or_none(lambda: experiment.validate(config, workdir))
    processes.check_same_config(config)  # as given: relative paths resolve per host, and may differ
    config = with_absolute_paths(config)
    run_start.input_shards(config.data)
    workdir = pathlib.Path(workdir).absolute()
    processes.all_or_none(lambda: refuse_missing_starts(config.training, workdir))
    existed, lock = take_workdir(config.data, workdir)  # what the workdir held before: a failed start leaves that
    try:
        # Until the loop takes signals as requests to stop at a step boundary (the final choice as its own),
        # SIGTERM and Ctrl-C stop the preparation at once (every process, where it ends), as a failed start:
        # the workdir unlocked and left as it was. Once the run's work is done, they are noted.
        with RaiseOnSignal(until="where the run's preparation ends, before its first step") as preparation:
            last = _locked_train_and_evaluate(config, workdir, preparation)
            on_complete(last)
            return with_late_signal(last, preparation.late_signum)
    except UserError:
        lock.release()
        if jax.process_index() == 0:
            run_start.undo_failed_start(workdir, existed)
        raise
    except Stopped as stop:
        lock.release()
        if jax.process_index() == 0:
            run_start.undo_failed_start(workdir, existed)
        trained = RunDirectory(workdir).metrics_file.exists()  # else it stopped before its first step
        logger.warning(
            "stopped by %s%s; exiting with %d",
            stop,
            "; resume with the same command" if trained else " before training began: nothing to save",
            exit_code_for_signal(stop.signum),
        )
        return {"stopped_by_signal": stop.signum}
    finally:
        lock.release()


def _locked_train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: pathlib.Path, preparation: RaiseOnSignal
) -> dict[str, Any]:
    prepared = run_start.prepare_run(config, workdir)
    # A save that fails (a full disk) closes orbax's event loop with other writes still in flight,
    # each of which then prints a "RuntimeError: Event loop is closed" traceback: wait for them.
    with draining_event_loops(), jax.set_mesh(prepared.mesh), nn.logical_axis_rules(prepared.rules):
        return _train(config, prepared, build_model(prepared.model_config), preparation)


def _train(config, prepared: PreparedRun, model: nn.Module, preparation: RaiseOnSignal) -> dict[str, Any]:
    """`preparation`: the handler that stops the run before its loop; a signal it holds (one that
    came inside JAX's code) stops the run before the loop takes signals over."""
    data, training = config.data, config.training
    run, checkpointer, tokenizers = prepared.directory, prepared.checkpointer, prepared.tokenizers
    objective = objective_for(model.config, tokenizers.source.mask_id, training.seed)
    optimizer, learning_rate = make_optimizer(config.optimizer, model.config.d_model)
    mesh, rules = prepared.mesh, prepared.rules
    boxed_state, state_shardings = run_start.state_shapes_and_shardings(config, model, optimizer, mesh, rules)
    abstract_state = sharding.abstract_with_shardings(sharding.strip_boxes(boxed_state), state_shardings)
    init_fn = make_init_fn(model, optimizer, data.max_length, data.max_length)
    logger.info("model: %s parameters", f"{count_parameters(abstract_state.params):,}")
    # Fine-tuning or composing: checked against this model before anything is compiled.
    starting_points = prepared.take_starting_points()
    # Step 0 measured where the run starts from other runs' checkpoints: a fine-tuned model's BLEU too, so best/ holds
    # the start until a step beats it (the final choice keeps it); a composed translator translates nothing yet.
    parts = {point.part for point in starting_points}
    at_start = ("evaluate", "bleu") if "model" in parts else ("evaluate",) if parts else ()
    overrides = starting_overrides(starting_points, abstract_state.params, model.config)
    del starting_points
    batch_sharding, replicated = sharding.batch_sharding(mesh, rules), sharding.replicated(mesh)

    batches = run_batches(config, prepared, objective)
    train_iterator, eval_data, length_filter = batches.train, batches.evaluation, batches.length_filter

    restored = checkpointer.restore_latest(abstract_state, train_iterator)
    if restored is None:
        state, step = jax.jit(init_fn, out_shardings=state_shardings)(training.seed), 0
        if overrides:
            params = with_overrides(state.params, overrides)
            state = state.replace(params=params, opt_state=restart_parameter_ema(state.opt_state, params))
    else:
        step, state, _ = restored
        logger.info("resumed from step %d of %s", step, checkpointer.directory)
    first_step = step  # where this run started or resumed
    rolled_back_after = -1 if restored is None else step  # the steps after it, of a history not continued
    del overrides  # the starting checkpoints' host parameters, no longer needed
    clock = TrainingClock(0.0 if restored is None else restored[2].train_seconds or 0.0)
    # Whether this segment's steps use R-Drop (rdrop_start.py).
    rdrop = RDropPhase(training, step, clock.seconds_before, None if restored is None else restored[2].rdrop_by_pace)
    budget = None
    if training.time_budget_minutes:
        work = {"evaluate": training.eval_every_steps, "bleu": training.bleu_every_steps}
        work["checkpoint"] = training.checkpoint_every_steps
        seconds = None if restored is None else restored[2].work_seconds
        budget = TimeBudget(training.time_budget_minutes * 60, clock, rdrop.to_come, work, seconds)
    # A run resumed with its budget already spent (saved at the budget's last step) trains no more.
    budget_spent = budget is not None and clock.seconds_before >= budget.seconds
    schedule_end = ScheduleEnd(config, state, replicated)
    saved = None if restored is None else restored[2]
    # Resumed where its length or budget ends it: shortened there, early; that step's work still to do.
    shortened, ends_unfinished = resumed_end(training, saved, step, budget_spent, schedule_end, state, learning_rate)
    state = schedule_end.at_start(state, step, saved and saved.config["training"], timed=budget is not None)
    if step < training.num_train_steps:  # its first step, compiling again, may spend the budget left: budget_resume.py
        state = end_at_resume(budget, schedule_end, state, step)

    train_fns = {
        with_rdrop: jax.jit(
            make_run_train_step(config, model, optimizer, learning_rate, objective, rdrop=with_rdrop),
            in_shardings=(state_shardings, batch_sharding),
            out_shardings=(state_shardings, replicated),
            donate_argnums=0,
        )
        for with_rdrop in ((False, True) if rdrop.switches else (True,))
    }
    eval_fn = jax.jit(
        make_eval_step(model, training, objective),
        in_shardings=(state_shardings.params, batch_sharding),
        out_shardings=replicated,
    )

    # Before the validator reads best/'s score, and the final choice looks in final/ for one made at its step.
    set_aside_rolled_back_keeping_best(run, rolled_back_after, config)  # best/ the best of the steps it goes on from
    validator = (
        BleuValidator(config, model.config, tokenizers.source, prepared.eval_source, run, tokenizers.target)
        if training.bleu_every_steps
        else None
    )
    preparation.check()  # before the metrics files: a stop until here is a failed start, undone
    writer = processes.all_or_none(lambda: MetricWriter(run, start_step=rolled_back_after))  # process 0 opens
    budget_record = HeldRecord(writer)  # a step's budget/ record, written once its work may no longer change it
    progress = progress_bar(training.num_train_steps, step)
    train_metrics = TrainMetrics(writer, checkpointer, progress, None if restored is None else restored[2].train_window)
    saver = RunSaver(
        checkpointer,
        train_metrics,
        prepared.metadata,
        clock,
        rdrop,
        budget,
        train_iterator,
        training.checkpoint_every_steps,
    )
    last: dict[str, Any] = {}

    def evaluate(step: int) -> None:
        train_metrics.flush()
        last["eval"] = _evaluate(eval_fn, state.params, eval_data, batch_sharding)
        last["eval_step"] = step
        writer.write(step, last["eval"], prefix="eval/")
        logger.info(
            "step %d: validation loss %.4f, perplexity %s, accuracy %.4f%s",
            step,
            last["eval"]["loss"],
            perplexity_text(last["eval"]["perplexity"]),
            last["eval"]["accuracy"],
            length_filter.dropped_since(first_step, processes.summed_over_processes),
        )
        train_metrics.restart_interval()

    def validate_bleu(step: int) -> None:
        train_metrics.flush()
        last["bleu"] = validator(step, state.params, prepared.metadata)
        writer.write(step, last["bleu"], prefix="eval/")
        train_metrics.restart_interval()

    def checkpoint(step: int) -> None:  # the run's last where its length, or its budget read at this step, ends it
        budget_record.write_held()  # before the save: a kill after it loses none of the step's records
        saver.save(step, state, last=step >= training.num_train_steps or budget_spent)

    periodic = [
        Periodic("log", training.log_every_steps, lambda step: train_metrics.flush(), at_last_step=False),
        Periodic("evaluate", training.eval_every_steps, evaluate, timed=True),
        Periodic("bleu", training.bleu_every_steps if validator else 0, validate_bleu, timed=True),
        Periodic("checkpoint", training.checkpoint_every_steps, checkpoint, timed=True, saves=True),
    ]

    def spent_by_the_work() -> bool:
        """Asked after a step's evaluation or BLEU, before its checkpoint: whether they spent the budget."""
        nonlocal state, budget_spent
        budget_spent, state = spent_by_work(budget, schedule_end, state, step, budget_record)
        return budget_spent

    timing = () if budget is None else (budget.work_done, spent_by_the_work)
    seconds_read = clock.seconds_before  # the training seconds of the last budget check
    clock.start()  # the start's measurement below is the loop's work, spent from its budget as any evaluation
    if step == 0:  # the start on this run's validation data, where fine-tuning or composing starts
        run_at_start(periodic, at_start, None if budget is None else budget.work_done)
    if budget_spent:
        logger.info("time budget of %g minutes already spent at step %d", training.time_budget_minutes, step)
    if ends_unfinished:
        best_bleu = None if validator is None else validator.best_bleu
        shortened_end.end_work(periodic, step, writer, checkpointer, saved, prepared.metadata, best_bleu)
        saver.save(step, state, in_place=True)
    preparation.check()  # one held since: not handed to the loop, which would compile and take a step first
    unreadable = None  # the data's error that stopped the loop
    ahead = StepsAhead()  # a signal stops the run at the step computing, not at the next log step
    with StopRequest() as stop:
        try:
            stopping = stop.agreed()  # a signal during the compilation: no step
            while step < training.num_train_steps and not stopping and not budget_spent:
                try:
                    host_batch = next(train_iterator)
                except DataError as error:  # a prepared file damaged since the start: unreadable_batch.py
                    unreadable = saved_before_stopping(
                        error, step, first_step, functools.partial(saver.save_steps_done, state=state)
                    )
                    raise unreadable from None
                batch = sharding.global_batch(host_batch, batch_sharding)
                state, metrics = train_fns[rdrop.started](state, batch)
                ahead.dispatched(metrics)
                step += 1
                train_metrics.add(step, metrics)
                progress.update(1)
                plain_end_step = None  # where the budget ends at the plain pace: read only at the check that decides
                if budget is not None:
                    budget.step_done(step)
                    if budget_check_due(step, training.log_every_steps, schedule_end):
                        deciding = rdrop.due(step)
                        if deciding:
                            jax.block_until_ready(state)  # the pace of the steps done, not of those dispatched
                        reading, state = check_budget(budget, schedule_end, state, step, budget_record, training)
                        budget_spent, seconds_read = reading.spent, reading.seconds
                        if reading.end_step is not None:  # the bar's total and ETA: where the budget ends
                            progress.total = max(step, min(round(reading.end_step), training.num_train_steps))
                            progress.refresh()
                        if deciding:
                            plain_end_step = reading.end_step
                if rdrop.starts_after(step, seconds_read, plain_end_step):
                    train_metrics.flush()  # a summary covers steps of one kind
                    if budget is not None:
                        budget.rdrop_started()
                    logger.info("R-Drop starts after step %d (%.1f minutes of training)", step, clock.seconds() / 60)
                # The budget's last step is the run's last: its evaluation and checkpoint are due.
                run_due(periodic, step, step if budget_spent else training.num_train_steps, *timing)
                budget_record.write_held()
                if budget_spent:
                    logger.info("time budget of %g minutes spent at step %d", training.time_budget_minutes, step)
                stopping = stops_after(step, BUDGET_CHECK_STEPS, stop, checkpointer, writer)  # failures raise first
            # All processes, or none; the budget's last step, as num_train_steps, leaves no step to resume.
            stopped_early = stop.agreed() and step < training.num_train_steps and not budget_spent
            if stopped_early:
                saver.save_steps_done(step, state)
                logger.warning(
                    "stopped by %s at step %d; checkpoint saved; exiting with %d; resume with the same command",
                    stop.signal_name,
                    step,
                    exit_code_for_signal(stop.signum),
                )
            if not stopped_early:  # stopped, the steps since the last record are in the checkpoint, not written
                train_metrics.flush()
                raise_held_write(writer)
                remove_beyond_keep(checkpointer, training.keep_checkpoints)  # resumed at its end, orbax applied none
        finally:
            progress.close()
            try:
                checkpointer.close()
            except Exception:
                if unreadable is None:
                    raise  # else the failed save's error again, said in the data's error raised
            writer.close()
            if validator:
                validator.close()
    train_seconds = clock.seconds()  # the loop's, without the final choice
    if stopped_early or not training.final_choice:
        preparation.finish()  # nothing is left that a signal would stop: one from now on is noted
    if not stopped_early and stopped_before_the_final_choice(stop, step, training.final_choice):
        stopped_early = True
        preparation.finish()  # the choice is left to the same command: nothing else is left to stop
    if training.final_choice and not stopped_early:  # after close(): every checkpoint is written
        metadata = prepared.metadata.replace(train_seconds=train_seconds)
        candidates = (config, model.config, tokenizers, prepared.eval_source, run, step, state.params, metadata)
        choose = functools.partial(choose_final, *candidates, ema_params=parameter_ema(state.opt_state))
        signum = choose_unless_stopped(choose, run, step, last)
        if signum is not None:
            stopped_early, stop.signum = True, signum
        preparation.finish()
    if train_metrics.last is not None:
        last["train"] = train_metrics.last
    last["step"] = step
    if last.get("eval_step") == step:  # kept, and named by the summary, only where a signal stopped the run after it
        del last["eval_step"]
    last["train_seconds"] = train_seconds
    if budget_spent:  # the budget named: a finished run started again without it keeps this record
        last["ended_by"], last["time_budget_minutes"] = "time budget", training.time_budget_minutes
    if shortened:
        last["shortened_by"] = shortened
    last["first_step"] = first_step
    if stopped_early:
        last["stopped_by_signal"] = stop.signum
    return write_last_metrics_in_process_0(run, last)
