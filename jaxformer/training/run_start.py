"""The start of a run, before its first step: the workdir held, the run already in it compared,
the data prepared, the tokenizers trained or restored, the model described, the mesh made.

`prepare_run(config, workdir)` returns all of it as a `PreparedRun`; `undo_failed_start` takes
back what a start that failed on bad input added to the workdir. loop.py trains from there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.data.sources import (
    builder_for_run,
    check_languages,
    check_same_data,
    check_split,
    data_fingerprint,
    load_split,
    prepare,
)
from jaxformer.errors import CheckpointError, UserError
from jaxformer.files import written_file
from jaxformer.model.architectures import build_model
from jaxformer.model.config import TransformerConfig
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.killed_writes import remove_killed_writes
from jaxformer.run.lock import WorkdirLock, WorkdirLockedError
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.run.rolled_back import check_averaged_movable
from jaxformer.training import experiment, processes, resume_rules, sharding, text_sides
from jaxformer.training.final_choice import check_kept_choice
from jaxformer.training.init_from import (
    PARTS,
    StartingPoint,
    check_starting_points,
    load_starting_points,
    side_tokenizers,
    started_from,
    started_from_params,
)
from jaxformer.training.kept_checkpoints import check_keep_not_lowered
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.resume_rules import INHERITED_DECODING, value_or_before_the_key
from jaxformer.training.run_tokenizer import RunTokenizers, check_given_models, log_unknown_rate, tokenizer_for_run
from jaxformer.training.run_vocabulary import vocabulary_sizes_before_the_data
from jaxformer.training.state import make_init_fn
from jaxformer.training.unused_settings import unused_settings
from jaxformer.training.validation_bleu import check_best_measured_alike

logger = logging.getLogger(__name__)


def hold_workdir(workdir: pathlib.Path) -> WorkdirLock:
    """Process 0 takes the workdir's lock, then removes the temporaries killed runs' writes left
    (run/killed_writes.py); every process learns whether it got it."""
    lock = WorkdirLock(workdir)
    failure = None
    if jax.process_index() == 0:
        try:
            lock.acquire()
        except WorkdirLockedError as error:
            failure = error
        else:  # before the other processes go on: none writes the run's files meanwhile
            remove_killed_writes(workdir)
    if jax.process_count() > 1:
        held = multihost_utils.broadcast_one_to_all(np.int32(failure is None))
        if not held and failure is None:
            failure = WorkdirLockedError(f"{workdir} is in use by another training run (see process 0's log)")
    if failure is not None:
        raise failure
    try:
        processes.check_shared_workdir(workdir)
    except processes.WorkdirNotSharedError:
        lock.release()
        raise
    return lock


def input_shards(data: ml_collections.ConfigDict) -> tuple[int, range]:
    """(number of input shards, the shards this process reads) for the `data` section."""
    shards = data.input_shards or jax.process_count()
    if shards % jax.process_count() or data.batch_size % shards:
        raise experiment.ConfigError(
            f"data.input_shards={shards} must be a multiple of the {jax.process_count()} processes "
            f"and divide data.batch_size={data.batch_size}"
        )
    per_process = shards // jax.process_count()
    return shards, range(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)


def check_same_run(workdir: pathlib.Path, saved: CheckpointMetadata | None, config: ml_collections.ConfigDict) -> None:
    if saved is None:
        return
    differences = resume_rules.resume_differences(saved.config, config)
    if differences:
        raise CheckpointError(
            f"{workdir} holds a run with another configuration; use a new workdir or restore these values: "
            + "; ".join(differences)
        )
    changed = resume_rules.resume_differences(saved.config, config, free=True)
    if changed:
        logger.warning("resuming with values that a resumed run may change: %s", "; ".join(changed))


def settle_inherited_decoding(
    config: ml_collections.ConfigDict, saved: CheckpointMetadata | None, start: StartingPoint | None
) -> None:
    """Sets each INHERITED_DECODING key left None (validation BLEU, best/ and the final choice read
    them; the checkpoints save them): a resumed run's is the one its checkpoint `saved`; a run
    started from training.init_from's `start` takes the value that run decodes with (a --from_hf
    import's length penalty is transformers', as the import says to decode it), logged; else the
    value before the key (gnmt, no renormalisation)."""
    origin = saved if saved is not None else start.metadata if start is not None else None
    origin_decoding = (origin.config if origin is not None else {}).get("decoding", {})
    settled = []
    for key in INHERITED_DECODING:
        if config.decoding[key] is None:
            config.decoding[key] = value_or_before_the_key(key, origin_decoding.get(key))
            settled.append(f"decoding.{key}={config.decoding[key]}")
    if saved is None and start is not None and settled:
        logger.info(
            "%s (validation BLEU, best/ and the final choice): those of %s, training.init_from; set a key to "
            "choose another",
            ", ".join(settled),
            start.where,
        )


def prepare_data(data: ml_collections.ConfigDict, builder, languages: Sequence[str]) -> tuple[Any, Any]:
    """(training split, evaluation split) of the `data` section from its `builder`, prepared once
    for all processes; `languages`: those the run reads (`text_sides.text_languages`). A split key
    naming a split the dataset has not is refused, naming the key, before it is prepared."""
    keys = ("train_split", "eval_split")
    if jax.process_count() > 1:  # one process prepares the dataset, the others wait and read it

        def prepare_on_process_0() -> None:
            if jax.process_index() == 0:
                for key in keys:
                    check_split(builder, data[key], given_as=_setting(data, key))
                check_languages(builder, languages)
                prepare(builder)

        # Its error raised in every process: a barrier left the others waiting for jax's timeout.
        processes.all_or_none(prepare_on_process_0)
    else:  # both splits before either is prepared: a wmt eval_split it has not, refused before the download
        for key in keys:
            check_split(builder, data[key], given_as=_setting(data, key))
    return tuple(load_split(builder, data[key], languages, given_as=_setting(data, key)) for key in keys)


def _setting(data: ml_collections.ConfigDict, key: str) -> str:
    """How errors name the `data` section's `key` and its value."""
    return f"config data.{key}={data[key]!r}"


# ------------------------------------------------------------------------------------------
# The run.


def undo_failed_start(workdir: pathlib.Path, existed: set[pathlib.Path] | None) -> None:
    """After a start that failed on bad input before its first checkpoint, removes what it added
    to the workdir (empty folders, tokenizers trained or restored from a start: nothing a rerun
    needs, and what would refuse a corrected config), and the workdir itself when the run made it:
    bad input leaves nothing behind. `existed`: the workdir's entries before (None: no workdir). A
    run that started training (its metrics tell how it failed) or saved a checkpoint keeps everything."""
    run = RunDirectory(workdir)
    if run.metrics_file.exists() or any(path.is_file() for path in run.checkpoints.rglob("*")):
        return
    added = [entry for entry in workdir.iterdir() if entry not in (existed or set())]
    for entry in added:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    if added:
        logger.info("removed what this start added to %s: %s", workdir, ", ".join(sorted(e.name for e in added)))
    if existed is None and not any(workdir.iterdir()):
        workdir.rmdir()


def _links_into_no_folder(path: pathlib.Path) -> bool:
    """Whether `path` is a symbolic link into a folder that does not exist: a write through it fails."""
    return path.is_symlink() and not written_file(path).parent.is_dir()


def _link_refusal(path: pathlib.Path, purpose: str) -> UserError:
    return UserError(
        f"{path} is a link to {os.readlink(path)}, in a folder that does not exist, where the run {purpose}: "
        "move it away"
    )


def check_output_paths(config: ml_collections.ConfigDict, run: RunDirectory) -> None:
    """A UserError naming the first of the folders and files `config`'s run writes in `run` where
    something else lies, found before any work, not by a save or a write after hours of steps
    (jaxformer-sweep checks its variants' runs so before the first trains). Reads nothing else."""
    training = config.training
    folders = ["latest"]  # where the run saves, and where the final choice reads a candidate
    folders += ["best"] if training.bleu_every_steps or training.final_choice else []
    folders += ["final"] if training.final_choice else []
    run.check_folders(*folders)  # a file there
    for path in (run.metrics_file, run.rolled_back_metrics_file, run.last_metrics_file):  # and a folder there
        if path.is_dir():
            raise UserError(f"{path} is a folder, where the run writes its metrics: move it away")
        if _links_into_no_folder(path):
            raise _link_refusal(path, "writes its metrics")
    events = run.tensorboard_dir  # else mkdir's traceback once the data, tokenizers and model are ready
    if (events.exists() or events.is_symlink()) and not events.is_dir():  # a file, a dangling link
        raise UserError(f"{events} is not a directory, where the run writes its TensorBoard events: move it away")


def check_tokenizer_paths(config: ml_collections.ConfigDict, run: RunDirectory, resuming: bool) -> None:
    """A UserError for a tokenizer file of `run` that the run cannot save: a link into a folder
    that does not exist (written through once the tokenizer is trained or restored: a traceback),
    and where a new run starts, a folder (named only once the data was prepared). A resumed run's
    folder there is check_given_models's to name, with the checkpoint that restores the file."""
    paths = [run.tokenizer_file] + ([run.target_tokenizer_file] if config.tokenizer.separate_vocabularies else [])
    for path in paths:
        if path.is_dir() and not resuming:
            raise UserError(f"{path} is a folder, where the run saves its tokenizer: move it away")
        if _links_into_no_folder(path):
            raise _link_refusal(path, "saves its tokenizer")


@dataclasses.dataclass
class PreparedRun:
    """What a run has ready before its model is built and its state restored or initialised."""

    directory: RunDirectory
    checkpointer: Checkpointer
    tokenizers: RunTokenizers
    metadata: CheckpointMetadata  # written with every checkpoint (each save sets its step)
    train_source: Sequence
    eval_source: Sequence
    starting_points: tuple[StartingPoint, ...]  # fine-tuning or composing; none when resuming or from scratch
    model_config: TransformerConfig  # with the vocabulary sizes of `tokenizers`
    mesh: jax.sharding.Mesh
    rules: Any  # logical axis rules (training/sharding.py)

    def take_starting_points(self) -> tuple[StartingPoint, ...]:
        """The starting points, handed over once: their host parameters are freed once used."""
        points, self.starting_points = self.starting_points, ()
        return points


def prepare_run(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> PreparedRun:
    """Everything before the model is built, for `config` in the (held) `workdir`: checked against
    the run already there, the data prepared, the tokenizers ready and the model described."""
    data, training = config.data, config.training
    logger.info("%s (all keys: --print_config)", experiment.describe(config))
    logger.info("devices: %s", jax.devices())

    run = RunDirectory(workdir)
    check_output_paths(config, run)
    checkpointer = Checkpointer(run.checkpoints, keep=training.keep_checkpoints)
    latest = checkpointer.latest_step_metadata()
    saved = None if latest is None else latest[1]
    check_tokenizer_paths(config, run, resuming=latest is not None)
    if latest is not None:  # first: a changed data.input_shards would follow from this
        checkpointer.check_process_count(latest[0])
    check_same_run(workdir, saved, config)
    for setting in unused_settings(config, resuming=latest is not None):  # as given, before settling
        logger.warning("unused: %s", setting)
    if latest is not None:
        settle_inherited_decoding(config, saved, None)
        saves_again = resume_rules.trains_further(training, latest[0], saved.train_seconds or 0.0)
        default_keep = experiment.default_config().training.keep_checkpoints  # a run saved before the key
        kept_before = saved.config.get("training", {}).get("keep_checkpoints", default_keep)
        check_keep_not_lowered(checkpointer, kept_before, training.keep_checkpoints, saves_again, latest[0])
        check_kept_choice(config, run, latest[0], saved.train_seconds or 0.0)
        if saves_again:  # the newest checkpoint whose metadata reads: the one restored, unless its arrays are damaged
            check_best_measured_alike(config, run, latest[0])
    check_averaged_movable(run, -1 if latest is None else latest[0])  # else refused once the data is ready and restored
    if latest is not None and any(training.get(key) is not None for key in PARTS.values()):
        logger.info("resuming this workdir's run; training.init_*from only set where a new run starts")
    starting_points = load_starting_points(training) if latest is None else ()
    check_starting_points(starting_points, config)
    if latest is None:
        settle_inherited_decoding(
            config, None, next((point for point in starting_points if point.part == "model"), None)
        )
    if latest is not None:
        saved_tokenizers = (saved, f"checkpoint {latest[0]} of {checkpointer.directory}")
    elif starting_points and starting_points[0].part == "model":  # its embeddings belong to its tokenizer
        saved_tokenizers = (starting_points[0].metadata, f"the fine-tuning start, {starting_points[0].where}")
    else:
        saved_tokenizers = None
    resuming = latest is not None
    check_given_models(config, run, saved_tokenizers, side_tokenizers(starting_points), resuming)  # before the data

    mesh = sharding.make_mesh(config.mesh.shape)
    rules = sharding.rules_from_config(config.mesh.logical_axis_rules)
    sharding.check_batch_size(data.batch_size, mesh, rules)
    sharding.check_batch_size(data.eval_batch_size, mesh, rules, "data.eval_batch_size")
    sharding.warn_unsplit_batch(mesh, rules)
    logger.info("mesh: %s", dict(mesh.shape))
    sizes = vocabulary_sizes_before_the_data(config, saved, starting_points)
    if sizes is not None:
        check_mesh_fits_the_configured_model(config, mesh, rules, sizes)

    trained_on = saved and saved.data_fingerprint
    builder = builder_for_run(data, text_sides.text_side(config), trained_on)
    trained_files = saved and (saved.config or {}).get("data", {}).get("files")
    remedy = "restore the files and data.files as the run had them, or use a new workdir"
    check_same_data(builder, trained_on, workdir, remedy, trained_files)  # before preparing: prepares nothing
    train_source, eval_source = prepare_data(data, builder, text_sides.text_languages(config))
    check_same_data(builder, trained_on, workdir, remedy, trained_files)  # downloads: fingerprinted once fetched
    fingerprint = data_fingerprint(builder)
    tokenizers = processes.all_or_none(  # process 0 writes the tokenizers: its error (a full disk) is every process's
        lambda: tokenizer_for_run(
            config, run, train_source, saved_tokenizers, side_tokenizers(starting_points), resuming=resuming
        )
    )
    log_unknown_rate(config, tokenizers, train_source)

    model_config = experiment.model_config(
        config, tokenizers.target.vocab_size, None if tokenizers.shared else tokenizers.source.vocab_size
    )
    if config.model.get("matmul_dtype") == "auto":
        operands, platform = model_config.matmul_operand_dtype.name, jax.default_backend()
        logger.info("model.matmul_dtype=auto: %s weight products on this machine (%s)", operands, platform)
    metadata = CheckpointMetadata(
        config=config.to_dict(),
        model=model_config.to_dict(),
        tokenizer=tokenizers.source.model_proto,
        target_tokenizer=None if tokenizers.shared else tokenizers.target.model_proto,
        data_fingerprint=fingerprint,
        step=0,
        started_from=saved.started_from if resuming else started_from(starting_points),
        # A resumed run restores its own checkpoint and reads no start: its record is carried, never read again.
        started_from_params=saved.started_from_params if resuming else started_from_params(starting_points),
    )
    return PreparedRun(
        run, checkpointer, tokenizers, metadata, train_source, eval_source, starting_points, model_config, mesh, rules
    )


def state_shapes_and_shardings(config, model: nn.Module, optimizer, mesh, rules) -> tuple[Any, Any]:
    """(the train state's abstract tree, boxed with logical names; its shardings), once every array
    is known to divide along its mesh axes (MeshError naming the first that does not)."""
    data = config.data
    boxed_state = jax.eval_shape(
        make_init_fn(model, optimizer, data.max_length, data.max_length, boxed=True), config.training.seed
    )
    state_shardings = sharding.logical_shardings(boxed_state, mesh, rules)
    sharding.check_divisible(boxed_state, state_shardings, mesh)
    return boxed_state, state_shardings


def check_mesh_fits_the_configured_model(config, mesh, rules, sizes: tuple[int, int]) -> None:
    """The mesh against the model the config describes with (source, target) vocabulary `sizes`,
    before any data is prepared: a mesh that cannot hold it is found in seconds, not after hours of
    preparing WMT (a resumed run may read its data from a new data.data_dir)."""
    source_size, target_size = sizes
    model_config = experiment.model_config(
        config, target_size, source_size if config.tokenizer.separate_vocabularies else None
    )
    optimizer, _ = make_optimizer(config.optimizer, model_config.d_model)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state_shapes_and_shardings(config, build_model(model_config), optimizer, mesh, rules)
