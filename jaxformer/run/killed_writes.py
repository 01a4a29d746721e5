"""What a training run killed outright (kill -9, power loss) while it wrote one of its files whole
leaves beside it: the temporary that `files.write_bytes_atomically` renames over it,
`.<name>.<8 hex digits>.tmp`, which nothing else would ever remove. A run holding the workdir's
lock removes those of its own files at its start, each named in a warning: while it holds the lock,
no other process writes them."""

from __future__ import annotations

import logging
import os
import pathlib

from jaxformer.files import leftover_temporaries
from jaxformer.run.directory import RunDirectory

logger = logging.getLogger(__name__)


def files_written_whole(run: RunDirectory) -> list[pathlib.Path]:
    """The files a training run writes through a temporary in its workdir: its tokenizers,
    last_metrics.json, and the metadata of the checkpoints in checkpoints/, best/ and final/
    (`Checkpointer.metadata_file`). Not averaged/'s: jaxformer-average-checkpoints writes there,
    under its own lock, beside a running run."""
    files = [run.tokenizer_file, run.target_tokenizer_file, run.last_metrics_file]
    for folder in (run.checkpoints, run.best, run.final):
        try:
            steps = [path for path in sorted(folder.iterdir()) if path.name.isdigit() and path.is_dir()]
        except OSError:  # none yet, or not a folder: the run says so where it saves there
            continue
        files += [step / "metadata" / "metadata" for step in steps]
    return files


def remove_killed_writes(workdir: str | os.PathLike) -> None:
    """Removes the temporaries of `files_written_whole` left in `workdir`, with a warning naming
    each; the caller holds the workdir's lock (`run.lock.WorkdirLock`)."""
    for destination in files_written_whole(RunDirectory(workdir)):
        for path in leftover_temporaries(destination):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:
                logger.warning(
                    "cannot remove %s (%s), left by a run killed while writing %s", path, error.strerror, destination
                )
                continue
            logger.warning("removed %s, left by a run killed while writing %s", path, destination)
