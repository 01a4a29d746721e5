"""Loading a run's checkpoint to translate or evaluate with it, without modifying the run."""

from __future__ import annotations

import logging
import os
from typing import Any

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.metadata import CheckpointMetadata


def load_checkpoint(
    workdir: str | os.PathLike, checkpoint: str | int = "latest", params: bool = True
) -> tuple[int, CheckpointMetadata, Any]:
    """(step, metadata, params) of a workdir's checkpoint: "latest", "best", "averaged" or a step
    of `workdir/checkpoints`. Parameters come back as host arrays, without optimizer state
    (None with `params=False`), verified against their checksums.

    "latest" skips a damaged newest checkpoint (metadata or parameters unreadable, or not
    matching their checksums) with a warning and uses the newest one that reads, as training
    does, but sets nothing aside: nothing in the workdir is modified. Any other choice that is
    damaged is a `CheckpointError` naming it."""
    which = "latest" if isinstance(checkpoint, int) else checkpoint
    directory = RunDirectory(workdir).checkpoint_directory(which)
    if not directory.is_dir():
        raise CheckpointError(f"{directory} does not exist: no {which!r} checkpoint in {workdir}")
    checkpointer = Checkpointer(directory, keep=None, read_only=True)

    def read(step: int) -> tuple[CheckpointMetadata, Any]:  # CheckpointError if damaged
        metadata = checkpointer.read_metadata(step)
        return metadata, checkpointer.restore_params(step) if params else None

    try:
        steps = checkpointer.steps()
        if not steps:
            raise CheckpointError(f"{directory} holds no checkpoint")
        if checkpoint != "latest":
            step = checkpoint if isinstance(checkpoint, int) else steps[-1]
            if step not in steps:
                raise CheckpointError(f"{directory} has no checkpoint for step {step}; it has {steps}")
            return (step, *read(step))
        damaged = []
        for step in reversed(steps):
            try:
                metadata, restored = read(step)
            except CheckpointError as error:
                damaged.append((step, error))
                continue
            for bad_step, error in damaged:
                logging.warning("checkpoint %d of %s is damaged (%s); using step %d", bad_step, directory, error, step)
            return step, metadata, restored
        raise CheckpointError(
            f"no checkpoint in {directory} can be read: " + "; ".join(f"step {s}: {error}" for s, error in damaged)
        )
    finally:
        checkpointer.close()
