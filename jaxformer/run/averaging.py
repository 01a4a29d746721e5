"""Checkpoint averaging: the mean parameters of a run's last N checkpoints (`workdir/averaged`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.metadata import CheckpointMetadata


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


def averaged_last(workdir: str | os.PathLike, last: int) -> tuple[CheckpointMetadata, Any]:
    """(metadata, mean parameters) of the last `last` checkpoints of `workdir/checkpoints`; the
    metadata is the newest one's, with `averaged_steps` set. `CheckpointError` when fewer are kept."""
    reader = Checkpointer(RunDirectory(workdir).checkpoints, keep=None, read_only=True)
    steps = reader.steps()
    reader.close()
    if len(steps) < last:
        raise CheckpointError(
            f"{workdir} has {len(steps)} checkpoints ({steps}); cannot average the last {last}. "
            "Raise training.keep_checkpoints to keep more."
        )
    chosen = steps[-last:]
    trees, metadata = [], None
    for step in chosen:
        _, metadata, params = load_checkpoint(workdir, step)
        trees.append(params)
        logging.info("read step %d", step)
    return metadata.replace(step=chosen[-1], averaged_steps=tuple(chosen)), average_parameters(trees)


def average_last(workdir: str | os.PathLike, last: int) -> tuple[int, list[int]]:
    """Writes the mean of the last `last` checkpoints as `workdir/averaged/<newest step>`;
    returns (that step, the steps averaged). Averages of earlier steps stay beside it (`averaged`
    reads the newest); one of the same step is set aside as `<step>.replaced-<time>`."""
    metadata, params = averaged_last(workdir, last)
    writer = Checkpointer(RunDirectory(workdir).averaged, keep=None)
    writer.save_params(metadata.step, params, metadata)
    writer.close()
    return metadata.step, list(metadata.averaged_steps)
