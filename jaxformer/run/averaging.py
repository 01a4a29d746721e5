"""Checkpoint averaging: the mean parameters of a run's last N checkpoints (`workdir/averaged`)."""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.export_origin import given_instead_of_a_run
from jaxformer.run.lock import AveragingLock
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.run.removal import listing_again

logger = logging.getLogger(__name__)


def average_parameters(trees: list[Any]) -> Any:
    """The element-wise mean of parameter trees of one structure, accumulated in float64."""
    if not trees:
        raise ValueError("nothing to average")
    structure = jax.tree.structure(trees[0])
    for index, tree in enumerate(trees[1:], start=1):
        if jax.tree.structure(tree) != structure:
            raise ValueError(f"parameter tree {index} differs in structure from tree 0")
    return jax.tree.map(
        lambda *leaves: (sum(np.asarray(leaf, np.float64) for leaf in leaves) / len(leaves)).astype(
            np.asarray(leaves[0]).dtype
        ),
        *trees,
    )


def model_differences(metadata: CheckpointMetadata, newest: CheckpointMetadata) -> list[str]:
    """What makes checkpoint `metadata` another model's than checkpoint `newest`, each as
    'what: this -> newest': a field of the model both describe, a tokenizer (its pieces are the
    embeddings' rows), the data they were trained on. The run's config is the caller's to compare
    (`config_differences`): which of its keys define a run is training's to say."""
    differences = [
        f"model.{field}: {metadata.model[field]!r} -> {newest.model[field]!r}"
        for field in sorted(set(metadata.model) & set(newest.model))
        # "auto" resolves by the machine each run segment ran on, and a resumed run may turn remat
        # on or off (out of memory): the parameters are the same
        if field not in ("matmul_dtype", "remat_policy") and metadata.model[field] != newest.model[field]
    ]
    differences += [
        f"{name}: another sentencepiece model"
        for name, value, newest_value in (
            ("tokenizer", metadata.tokenizer, newest.tokenizer),
            ("target_tokenizer", metadata.target_tokenizer, newest.target_tokenizer),
        )
        if value != newest_value
    ]
    if None not in (metadata.data_fingerprint, newest.data_fingerprint) and (
        metadata.data_fingerprint != newest.data_fingerprint
    ):
        differences.append(f"data fingerprint: {metadata.data_fingerprint} -> {newest.data_fingerprint}")
    return differences


ConfigDifferences = Callable[[dict[str, Any], dict[str, Any]], list[str]]  # (config, newest's) -> "key: a -> b"


def averaged_last(
    workdir: str | os.PathLike,
    last: int,
    config_differences: ConfigDifferences | None = None,
    last_flag: str | None = None,
) -> tuple[CheckpointMetadata, Any]:
    """(metadata, mean parameters) of the last `last` checkpoints of `workdir/checkpoints`; the
    metadata is the newest one's, with `averaged_steps` set. `CheckpointError`, before any
    parameters are read, when fewer are kept or when one of them is not of the newest one's run:
    `model_differences`, and `config_differences` of their configs when given; where two or more
    checkpoints could be averaged instead, it offers them as `last_flag` (a command's flag for
    `last`, "--last") when given. When a run training in the workdir removes one of them while they
    are read, the last ones are listed again."""
    return listing_again(lambda: _average_once(workdir, last, config_differences, last_flag))


def _no_checkpoint(workdir: str | os.PathLike, checkpoints: os.PathLike) -> CheckpointError:
    """Nothing to average in `workdir`: a folder of a workdir, a step in one or an export is named
    as what it is, with the workdir to give, as the decoding commands name it."""
    instead = given_instead_of_a_run(pathlib.Path(workdir).absolute(), checkpoint_flag=None)
    return CheckpointError(instead or f"{workdir} has no checkpoint in {checkpoints}: nothing to average")


def _fewer(count: int, last_flag: str | None) -> str:
    """How to average the `count` checkpoints that can be, as the command is told (" (--last 3)"):
    nothing without its flag, or for one checkpoint, which is no average."""
    return f" ({last_flag} {count})" if last_flag is not None and count >= 2 else ""


def _the_one(step: int, last_flag: str | None) -> str:
    """What to use where checkpoint `step` alone could be averaged: the checkpoint itself, which its
    average would be, read where the average would be (as the command is told, where one was)."""
    read = f": give --checkpoint {step} where you would give --checkpoint averaged" if last_flag is not None else ""
    return f"checkpoint {step} itself (an average of one is that checkpoint{read})"


def _too_few(workdir: str | os.PathLike, steps: list[int], last: int, keep: int | None, last_flag: str | None) -> str:
    """Why `last` checkpoints cannot be averaged, with the remedies: average those there are (one:
    use it), and for later runs keep more; a run that kept fewer than its training.keep_checkpoints
    deleted none (it saved no more), so keeping more would not help."""
    plural = "s" if len(steps) != 1 else ""
    said = f"{workdir} has {len(steps)} checkpoint{plural} ({steps}); cannot average the last {last}"
    fewer = _fewer(len(steps), last_flag)
    if keep is not None and len(steps) < keep:
        instead = f"use {_the_one(steps[0], last_flag)}" if len(steps) == 1 else f"average fewer{fewer}"
        return (
            f"{said}: the run saved no more (it keeps up to training.keep_checkpoints={keep}); {instead}, "
            "or train on to save more"
        )
    if len(steps) == 1:
        return f"{said}. Use {_the_one(steps[0], last_flag)}, or raise training.keep_checkpoints to keep more."
    if fewer:
        return f"{said}. Average fewer{fewer}, or raise training.keep_checkpoints to keep more."
    return f"{said}. Raise training.keep_checkpoints to keep more."


def _not_of_one_run(
    directory: os.PathLike, step: int, newest: int, differences: list[str], agreeing: int, last_flag: str | None
) -> str:
    """Why checkpoint `step` and the `newest` cannot be averaged (the first of their `differences`),
    with the remedies: move the other run's out, or average the newest `agreeing`, all of one run
    (the newest alone: use it)."""
    more = len(differences) - 1
    more = f"; {more} more difference{'s' if more > 1 else ''}" if more else ""
    fewer = _fewer(agreeing, last_flag)
    if agreeing == 1:
        fewer = f", or use {_the_one(newest, last_flag)}"
    elif fewer:
        fewer = f", or average the last {agreeing}, which are of one run{fewer}"
    return (
        f"checkpoints {step} and {newest} of {directory} are not of one run (step {step} -> "
        f"step {newest}: {differences[0]}{more}), so they cannot be averaged; move the other run's "
        f"checkpoint out of that folder{fewer}"
    )


def _average_once(
    workdir: str | os.PathLike, last: int, config_differences: ConfigDifferences | None, last_flag: str | None
) -> tuple[CheckpointMetadata, Any]:
    reader = Checkpointer(RunDirectory(workdir).checkpoints, keep=None, read_only=True)
    try:
        steps = reader.steps()
        if not steps:
            raise _no_checkpoint(workdir, reader.directory)
        if len(steps) < last:
            keep = reader.read_metadata(steps[-1]).config.get("training", {}).get("keep_checkpoints")
            raise CheckpointError(_too_few(workdir, steps, last, keep, last_flag))
        chosen = steps[-last:]
        newest = reader.read_metadata(chosen[-1])
        differing = []  # (step, its differences from the newest): all, so that the newest agreeing ones are known
        for step in chosen[:-1]:
            metadata = reader.read_metadata(step)
            differences = config_differences(metadata.config, newest.config) if config_differences else []
            named = {difference.split(":")[0] for difference in differences}  # config.model and model agree
            differences += [item for item in model_differences(metadata, newest) if item.split(":")[0] not in named]
            if differences:
                differing.append((step, differences))
        if differing:
            (step, differences), agreeing = differing[0], len(chosen) - 1 - chosen.index(differing[-1][0])
            raise CheckpointError(_not_of_one_run(reader.directory, step, chosen[-1], differences, agreeing, last_flag))
        trees = []
        for step in chosen:
            trees.append(reader.read_params(step)[1])
            logger.info("read step %d", step)
    finally:
        reader.close()
    return newest.replace(step=chosen[-1], averaged_steps=tuple(chosen)), average_parameters(trees)


def average_last(
    workdir: str | os.PathLike,
    last: int,
    config_differences: ConfigDifferences | None = None,
    last_flag: str | None = None,
) -> tuple[int, list[int]]:
    """Writes the mean of the last `last` checkpoints as `workdir/averaged/<newest step>` (checked
    as `averaged_last` checks them); returns (that step, the steps averaged). Averages of earlier
    steps stay beside it (`averaged` reads the newest); one of the same step is set aside as
    `<step>.replaced-<time>`. Where `averaged` is not a folder, `CheckpointError`, and while another
    averaging of `workdir` runs, `WorkdirLockedError` naming it, before any checkpoint is read."""
    run = RunDirectory(workdir)
    run.check_folders("averaged")
    if not run.checkpoints.is_dir():  # before the lock, whose file would need the workdir
        raise _no_checkpoint(workdir, run.checkpoints)
    with AveragingLock(run):
        metadata, params = averaged_last(workdir, last, config_differences, last_flag)
        writer = Checkpointer(run.averaged, keep=None)
        try:
            writer.save_params(metadata.step, params, metadata)
        finally:  # a stop on the way (Ctrl-C) waits for orbax's writes: its threads would outlive the command
            writer.close()
    return metadata.step, list(metadata.averaged_steps)
