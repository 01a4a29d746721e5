"""train_and_evaluate(config, workdir): the whole training run, resumable from its workdir."""

from __future__ import annotations

import functools
import json
import logging
import math
import pathlib
import signal
import time
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import tqdm
from jax.experimental import multihost_utils

from jaxformer.data.pipeline import LengthFilter, ShardedBatches, eval_batches, record_text, train_dataset
from jaxformer.data.sources import data_fingerprint, get_builder, load_split
from jaxformer.data.tokenizer import Tokenizer, train_tokenizer
from jaxformer.errors import UserError, exit_code_for_signal
from jaxformer.model.transformer import Transformer
from jaxformer.training import experiment, sharding
from jaxformer.training.checkpoint import Checkpointer, CheckpointError, decode_bytes, encode_bytes
from jaxformer.training.metrics import MetricWriter, summarize
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.state import count_parameters, make_init_fn
from jaxformer.training.step import eval_step, train_step
from jaxformer.training.validation_bleu import BleuValidator
from jaxformer.training.workdir_lock import WorkdirLock, WorkdirLockedError

TOKENIZER_FILE = "tokenizer.model"


class NonFiniteLossError(UserError, FloatingPointError):
    """The training loss became NaN or infinite; the run stops without saving."""


# ------------------------------------------------------------------------------------------
# Tokenizer: trained once per workdir, then reused (and restored from a checkpoint if lost).
# ------------------------------------------------------------------------------------------


def _tokenizer_for(config, workdir: pathlib.Path, train_source, checkpointer: Checkpointer) -> Tokenizer:
    from jaxformer.data.tokenizer import TokenizerError

    path = workdir / TOKENIZER_FILE
    latest = checkpointer.latest_step_metadata()
    if latest is not None:  # resuming: the model was trained with the checkpoint's tokenizer
        where = f"checkpoint {latest[0]} of {checkpointer.directory}"
        try:
            saved = Tokenizer(decode_bytes(latest[1]["tokenizer"]))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"the tokenizer stored in {where} is unusable ({type(error).__name__}: {error})") from error
        if not path.exists():
            saved.save(path)
            logging.info("restored %s from %s", path, where)
        else:
            try:
                tokenizer = Tokenizer.load(path)
            except TokenizerError as error:
                raise CheckpointError(f"{error}; delete it to restore it from {where}") from error
            if tokenizer.model_proto != saved.model_proto:
                raise CheckpointError(
                    f"{path} is not the tokenizer stored in {where}, which the model was trained with; "
                    f"delete {path} to restore it from the checkpoint, or train in a new workdir"
                )
    if path.exists():
        tokenizer = Tokenizer.load(path)
        if tokenizer.vocab_size != config.tokenizer.vocab_size:
            raise CheckpointError(
                f"{path} has {tokenizer.vocab_size} pieces but tokenizer.vocab_size={config.tokenizer.vocab_size}; "
                "use a new workdir to train a new tokenizer"
            )
        return tokenizer
    languages = (config.data.source_language, config.data.target_language)

    def sentences():
        chunk = 4096  # batched reads: one random access per record is several times slower
        for start in range(0, len(train_source), chunk):
            indices = list(range(start, min(start + chunk, len(train_source))))
            records = train_source.__getitems__(indices) if hasattr(train_source, "__getitems__") else [train_source[i] for i in indices]
            for record in records:
                for language in languages:
                    yield record_text(record, language)

    tokenizer = train_tokenizer(
        sentences(), config.tokenizer.vocab_size, config.tokenizer.model_type,
        config.tokenizer.character_coverage, config.tokenizer.max_sentences,
    )
    if jax.process_index() == 0:  # training is deterministic: every process holds the same model
        tokenizer.save(path)
        logging.info("trained a %d-piece tokenizer, saved to %s", tokenizer.vocab_size, path)
    return tokenizer


# ------------------------------------------------------------------------------------------
# Signals: SIGTERM and Ctrl-C ask the loop to save and stop at the next step boundary.
# ------------------------------------------------------------------------------------------


class StopRequest:
    def __init__(self):
        self.signal_name: str | None = None
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signal_name = signal.Signals(signum).name
        self.signum = int(signum)
        logging.warning("%s received: saving a checkpoint and stopping after this step", self.signal_name)

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


# ------------------------------------------------------------------------------------------
# Metrics: fetched from the device once per log interval, never per step.
# ------------------------------------------------------------------------------------------


def _check_finite(step_metrics: list[tuple[int, dict]], checkpointer: Checkpointer) -> None:
    for step, metrics in step_metrics:
        loss = float(metrics["loss_sum"]) / max(float(metrics["weight"]), 1.0)
        if not (math.isfinite(loss) and math.isfinite(float(metrics["grad_norm"]))):
            saved = checkpointer.steps()
            kept = f"the last good checkpoint is step {saved[-1]} in {checkpointer.directory}" if saved else "no checkpoint was saved"
            raise NonFiniteLossError(
                f"training loss is {loss} (gradient norm {float(metrics['grad_norm'])}) at step {step}; "
                f"stopping without saving: {kept}. Lower optimizer.learning_rate_scale or check the data."
            )


def _local_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This process's slice of a batch every process holds whole."""
    rows = batch["inputs"].shape[0] // jax.process_count()
    start = jax.process_index() * rows
    return {key: value[start : start + rows] for key, value in batch.items()}


def _evaluate(eval_fn, params, batches, batch_sharding) -> dict[str, float]:
    totals = None
    for batch in batches:
        metrics = eval_fn(params, sharding.global_batch(_local_rows(batch), batch_sharding))
        totals = metrics if totals is None else jax.tree.map(lambda a, b: a + b, totals, metrics)
    return summarize(jax.device_get(totals))


# ------------------------------------------------------------------------------------------
# The run.
# ------------------------------------------------------------------------------------------


def _hold_workdir(workdir: pathlib.Path) -> WorkdirLock:
    """Process 0 takes the workdir's lock; every process learns whether it got it."""
    lock = WorkdirLock(workdir)
    failure = None
    if jax.process_index() == 0:
        try:
            lock.acquire()
        except WorkdirLockedError as error:
            failure = error
    if jax.process_count() > 1:
        held = multihost_utils.broadcast_one_to_all(np.int32(failure is None))
        if not held and failure is None:
            failure = WorkdirLockedError(f"{workdir} is in use by another training run (see process 0's log)")
    if failure is not None:
        raise failure
    return lock


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Trains (or resumes) the experiment `config` in `workdir`; returns the last metrics
    (with "stopped_by_signal": its number, when SIGTERM or Ctrl-C stopped the run early).

    Every config value is checked before anything is written; then the workdir is locked for
    the run (one run per workdir)."""
    experiment.validate(config)
    _input_shards(config)
    workdir = pathlib.Path(workdir).absolute()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot create the workdir {workdir}: {error.strerror}") from None
    lock = _hold_workdir(workdir)
    try:
        return _locked_train_and_evaluate(config, workdir)
    finally:
        lock.release()


def _locked_train_and_evaluate(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict[str, Any]:
    data, training = config.data, config.training
    logging.info("config:\n%s", config)
    logging.info("devices: %s", jax.devices())

    checkpointer = Checkpointer(workdir / "checkpoints", keep=training.keep_checkpoints)
    saved = checkpointer.latest_metadata()
    if saved is not None:
        differences = experiment.resume_differences(saved["config"], config)
        if differences:
            raise CheckpointError(
                f"{workdir} holds a run with another configuration; use a new workdir or restore these values: "
                + "; ".join(differences)
            )

    mesh = sharding.make_mesh(config.mesh.shape)
    rules = sharding.rules_from_config(config.mesh.logical_axis_rules)
    sharding.check_batch_size(data.batch_size, mesh, rules)
    sharding.check_batch_size(data.eval_batch_size, mesh, rules)
    logging.info("mesh: %s", dict(mesh.shape))

    languages = (data.source_language, data.target_language)
    builder = get_builder(data.name, data.data_dir, data.raw_dir, data.download)
    if jax.process_count() > 1:  # one process prepares the dataset, the others wait and read it
        if jax.process_index() == 0:
            builder.download_and_prepare()
        multihost_utils.sync_global_devices("jaxformer: dataset prepared")
    train_source = load_split(builder, data.train_split, languages)
    eval_source = load_split(builder, data.eval_split, languages)
    fingerprint = data_fingerprint(builder)
    if saved is not None and saved.get("data_fingerprint", fingerprint) != fingerprint:
        raise CheckpointError(
            f"{workdir} was trained on other data files (fingerprint {saved['data_fingerprint']}) than "
            f"{builder.name} has now ({fingerprint}); restore the files or use a new workdir"
        )
    tokenizer = _tokenizer_for(config, workdir, train_source, checkpointer)

    model_config = experiment.model_config(config, tokenizer.vocab_size)
    model = Transformer(model_config)
    optimizer, schedule = make_optimizer(
        model_config.d_model, config.optimizer.warmup_steps, config.optimizer.learning_rate_scale,
        config.optimizer.b1, config.optimizer.b2, config.optimizer.eps, config.optimizer.clip_norm,
        config.optimizer.accumulation_steps,
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        return _train(config, workdir, mesh, rules, model, optimizer, schedule, checkpointer, tokenizer,
                      model_config, train_source, eval_source, fingerprint)


def _input_shards(config) -> tuple[int, range]:
    """(number of input shards, the shards this process reads)."""
    shards = config.data.input_shards or jax.process_count()
    if shards % jax.process_count() or config.data.batch_size % shards:
        raise experiment.ConfigError(
            f"data.input_shards={shards} must be a multiple of the {jax.process_count()} processes "
            f"and divide data.batch_size={config.data.batch_size}"
        )
    per_process = shards // jax.process_count()
    return shards, range(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)


def _train(config, workdir, mesh, rules, model, optimizer, schedule, checkpointer, tokenizer, model_config,
           train_source, eval_source, fingerprint):
    data, training = config.data, config.training
    boxed_state = jax.eval_shape(make_init_fn(model, optimizer, data.max_length, data.max_length, boxed=True), training.seed)
    state_shardings = sharding.logical_shardings(boxed_state, mesh, rules)
    abstract_state = sharding.abstract_with_shardings(sharding.strip_boxes(boxed_state), state_shardings)
    init_fn = make_init_fn(model, optimizer, data.max_length, data.max_length)
    logging.info("model: %s parameters", f"{count_parameters(abstract_state.params):,}")
    batch_sharding = sharding.batch_sharding(mesh, rules)
    replicated = sharding.replicated(mesh)

    length_filter = LengthFilter(data.max_length)
    shard_count, my_shards = _input_shards(config)
    train_iterator = ShardedBatches([
        iter(train_dataset(
            train_source, tokenizer, source_language=data.source_language, target_language=data.target_language,
            max_length=data.max_length, batch_size=data.batch_size // shard_count, seed=data.shuffle_seed,
            length_filter=length_filter, shard_index=shard, shard_count=shard_count, num_threads=data.num_threads,
        ))
        for shard in my_shards
    ])
    eval_data = eval_batches(
        eval_source, tokenizer, source_language=data.source_language, target_language=data.target_language,
        max_length=data.max_length, batch_size=data.eval_batch_size, max_examples=data.max_eval_examples,
    )

    restored = checkpointer.restore_latest(abstract_state, train_iterator)
    if restored is None:
        state, step = jax.jit(init_fn, out_shardings=state_shardings)(training.seed), 0
    else:
        step, state, _ = restored
        logging.info("resumed from step %d of %s", step, checkpointer.directory)
    metadata = {
        "config": config.to_dict(),
        "model": model_config.to_dict(),
        "tokenizer": encode_bytes(tokenizer.model_proto),
        "data_fingerprint": fingerprint,
    }

    step_fn = functools.partial(
        train_step, model=model, optimizer=optimizer, schedule=schedule,
        label_smoothing=training.label_smoothing, accumulation_steps=config.optimizer.accumulation_steps,
        loss_chunk_tokens=training.loss_chunk_tokens,
    )
    train_fn = jax.jit(
        lambda state, batch, step: step_fn(state, batch, jax.random.fold_in(state.rng, step)),
        in_shardings=(state_shardings, batch_sharding, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )
    eval_fn = jax.jit(
        functools.partial(eval_step, model=model, label_smoothing=training.label_smoothing),
        in_shardings=(state_shardings.params, batch_sharding),
        out_shardings=replicated,
    )

    validator = BleuValidator(config, model_config, tokenizer, eval_source, workdir) if training.bleu_every_steps else None
    writer = MetricWriter(workdir)
    pending: list[tuple[int, Any]] = []
    last: dict[str, Any] = {}
    interval_start, interval_tokens = time.perf_counter(), 0.0

    def flush_metrics():
        nonlocal interval_start, pending
        if not pending:
            return
        host = jax.device_get(pending)
        pending = []
        _check_finite(host, checkpointer)
        elapsed = time.perf_counter() - interval_start
        interval_start = time.perf_counter()
        totals = {key: sum(float(m[key]) for _, m in host) for key in host[0][1]}
        summary = summarize(totals)
        summary.update(
            learning_rate=float(host[-1][1]["learning_rate"]),
            grad_norm=float(np.mean([m["grad_norm"] for _, m in host])),
            tokens_per_second=totals["weight"] / elapsed,
            steps_per_second=len(host) / elapsed,
        )
        writer.write(host[-1][0], summary, prefix="train/")
        last["train"] = summary
        progress.set_postfix(
            loss=f"{summary['loss']:.3f}", lr=f"{summary['learning_rate']:.2e}", tok_s=f"{summary['tokens_per_second']:,.0f}"
        )

    def save(step):
        flush_metrics()  # never checkpoint past a NaN
        checkpointer.save(step, state, train_iterator, {**metadata, "step": step})

    with StopRequest() as stop, tqdm.tqdm(
        total=training.num_train_steps, initial=step, desc="train", unit="step", disable=jax.process_index() != 0,
        dynamic_ncols=True,
    ) as progress:
        try:
            while step < training.num_train_steps and stop.signal_name is None:
                batch = sharding.global_batch(next(train_iterator), batch_sharding)
                state, metrics = train_fn(state, batch, np.int32(step))
                step += 1
                pending.append((step, metrics))
                progress.update(1)
                if step % training.log_every_steps == 0:
                    flush_metrics()
                if step % training.eval_every_steps == 0 or step == training.num_train_steps:
                    flush_metrics()
                    last["eval"] = _evaluate(eval_fn, state.params, eval_data, batch_sharding)
                    writer.write(step, last["eval"], prefix="eval/")
                    logging.info(
                        "step %d: validation loss %.4f, perplexity %.2f, accuracy %.4f; length filter dropped %d of %d pairs read",
                        step, last["eval"]["loss"], last["eval"]["perplexity"], last["eval"]["accuracy"],
                        length_filter.dropped, length_filter.seen,
                    )
                if validator and (step % training.bleu_every_steps == 0 or step == training.num_train_steps):
                    flush_metrics()
                    last["bleu"] = validator(step, state.params, {**metadata, "step": step})
                    writer.write(step, last["bleu"], prefix="eval/")
                if step % training.checkpoint_every_steps == 0 or step == training.num_train_steps:
                    save(step)
            stopped_early = stop.signal_name is not None and step < training.num_train_steps
            if stopped_early:
                if step not in checkpointer.steps():
                    save(step)
                logging.warning(
                    "stopped by %s at step %d; checkpoint saved; exiting with %d; resume with the same command",
                    stop.signal_name, step, exit_code_for_signal(stop.signum),
                )
            flush_metrics()
        finally:
            checkpointer.close()
            writer.close()
            if validator:
                validator.close()
    last["step"] = step
    if stopped_early:
        last["stopped_by_signal"] = stop.signum
    if jax.process_index() == 0:
        (workdir / "last_metrics.json").write_text(json.dumps(last, indent=2))
    return last
