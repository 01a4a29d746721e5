"""What a training run killed outright (kill -9, power loss) while it wrote one of its files whole
leaves beside it: the temporary that `files.write_bytes_atomically` renames over it,
`.<name>.<8 hex digits>.tmp`, which nothing else would ever remove. A run holding the workdir's
lock removes those of its own files at its start, each named in a warning: while it holds the lock,
no other process writes them. A sweep holding its lock (sweep.lock) does the same for its own files:
sweep.jsonl, sweep.md and the pace records in pace/."""

from __future__ import annotations

import logging
import os
import pathlib
import re

from jaxformer.files import leftover_temporaries
from jaxformer.run.directory import RunDirectory, SweepDirectory

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


def sweep_files_written_whole(sweep: SweepDirectory) -> list[pathlib.Path]:
    """The files a sweep writes through a temporary in its directory: sweep.jsonl, sweep.md, and
    the pace record of each variant (`sweep_pace.pace_file`) whose temporary is in pace/ now, a
    variant the sweep file may no longer name."""
    files = [sweep.rows_file, sweep.table_file]
    try:
        entries = sorted(sweep.pace_dir.iterdir())
    except OSError:  # no pace/ (a wall-clock sweep), or not a folder: the sweep's checks name that
        return files
    matches = (PACE_TEMPORARY.fullmatch(path.name) for path in entries)
    records = sorted({match[1] for match in matches if match})  # two temporaries of one record: one name
    return files + [sweep.pace_dir / name for name in records]


PACE_TEMPORARY = re.compile(r"\.(.+\.json)\.[0-9a-f]{8}\.tmp")  # what files._create_unique_file names


def remove_killed_writes(workdir: str | os.PathLike) -> None:
    """Removes the temporaries of `files_written_whole` left in `workdir`, with a warning naming
    each; the caller holds the workdir's lock (`run.lock.WorkdirLock`)."""
    _remove_temporaries(files_written_whole(RunDirectory(workdir)), "a run")


def remove_killed_sweep_writes(workdir: str | os.PathLike) -> None:
    """Removes the temporaries of `sweep_files_written_whole` left in `workdir`, with a warning
    naming each; the caller holds the sweep's lock (`run.lock.SweepLock`)."""
    _remove_temporaries(sweep_files_written_whole(SweepDirectory(workdir)), "a sweep")


def _remove_temporaries(destinations: list[pathlib.Path], writer: str) -> None:
    for destination in destinations:
        for path in leftover_temporaries(destination):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:
                reason = error.strerror
                logger.warning(
                    "cannot remove %s (%s), left by %s killed while writing %s", path, reason, writer, destination
                )
                continue
            logger.warning("removed %s, left by %s killed while writing %s", path, writer, destination)
