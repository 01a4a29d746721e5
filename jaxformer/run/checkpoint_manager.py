"""Orbax's CheckpointManager of a run's checkpoint folder: its listing read again where a training
run removed a step meanwhile, its asynchronous saves waiting for the other processes at the save
barrier (run/save_barrier.py)."""

from __future__ import annotations

import pathlib

import orbax.checkpoint as ocp

from jaxformer.run.removal import LISTING_ATTEMPTS, CheckpointRemoved
from jaxformer.run.save_barrier import SaveBarrier


def checkpoint_manager(
    directory: pathlib.Path, keep: int | None, read_only: bool, barrier: SaveBarrier | None = None
) -> ocp.CheckpointManager:
    """Orbax's manager of `directory`, its asynchronous saves waiting for the other processes at
    `barrier`. It reads every step folder as it opens; a read-only one beside a training run can
    find a folder gone between listing and reading it, so it lists again. A save's step folder is
    made in its synchronous part, where a failure is raised (`start_save`) and told to the others:
    orbax's background thread kept it, and every process waited 5 minutes for it (a traceback)."""
    async_options = ocp.AsyncOptions(barrier_sync_fn=barrier, create_directories_asynchronously=False)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else keep, create=not read_only, async_options=async_options
    )
    for _ in range(LISTING_ATTEMPTS):
        try:
            return ocp.CheckpointManager(directory, options=options)
        except FileNotFoundError:
            if not (read_only and directory.is_dir()):
                raise
    raise CheckpointRemoved(
        f"the checkpoints in {directory} changed while they were listed, {LISTING_ATTEMPTS} times (a run training "
        "in that workdir removes its older checkpoints); run again"
    )
