"""Reading checkpoints beside a training run that removes its older ones as it saves: a step can go
between listing and reading it. Such a step is reported as removed (and "the newest" is listed
again), never as damaged."""

from __future__ import annotations

import logging
import os
import pathlib
import time
from collections.abc import Callable
from typing import TypeVar

from jaxformer.errors import CheckpointError

logger = logging.getLogger(__name__)


class CheckpointRemoved(CheckpointError):
    """A checkpoint went away while it was read: a run training in the workdir removed it (it keeps
    only its last checkpoints). Readers of "the newest" list the steps again and retry."""


# How often a reader lists a folder again when a training run removed what it was reading.
LISTING_ATTEMPTS = 5
T = TypeVar("T")


def listing_again(read: Callable[[], T]) -> T:
    """`read()`, called again (LISTING_ATTEMPTS times in all) while it raises `CheckpointRemoved`:
    each call lists the steps anew, so one that a training run removed is no longer among them."""
    for _ in range(LISTING_ATTEMPTS - 1):
        try:
            return read()
        except CheckpointRemoved:
            logger.info("a checkpoint was removed while it was read: listing the checkpoints again")
    return read()


# How long a step folder that failed to read is watched for a removal in progress: orbax removes a
# step's files first (in parallel threads) and its folder last, so a read in between finds the folder
# with files missing. A folder whose files keep going is watched on until it is gone.
REMOVAL_WATCH_SECONDS = 1.0
REMOVAL_POLL_SECONDS = 0.05


def _file_count(folder: pathlib.Path) -> int | None:
    """The number of files and folders under `folder`; None once it is gone."""
    if not folder.is_dir():
        return None
    return sum(len(names) + len(folders) for _, folders, names in os.walk(folder))


def refuse_removed(path: pathlib.Path) -> None:
    """`CheckpointRemoved` when the step folder above `path`, there when the read began, is gone or
    going: a run training in the workdir removed it, and calling it damaged would be wrong. A folder
    still there is watched for REMOVAL_WATCH_SECONDS (on, while its files keep disappearing)."""
    step_folder = path.parent
    count = _file_count(step_folder)
    deadline = time.monotonic() + REMOVAL_WATCH_SECONDS
    while count is not None and time.monotonic() < deadline:
        time.sleep(REMOVAL_POLL_SECONDS)
        now = _file_count(step_folder)
        if now is not None and now < count:  # being removed: wait for the folder itself to go
            deadline = time.monotonic() + REMOVAL_WATCH_SECONDS
        count = now
    if count is None:
        raise CheckpointRemoved(
            f"checkpoint {step_folder} was removed while it was read (a run training in that workdir keeps only "
            "its last checkpoints); run again"
        )
