"""A run's workdir taken before anything is written in it: every process looks at it (and at the
data source, which one host alone may fail to reach) before any creates it, then it is created,
then process 0 takes its lock (run_start.hold_workdir). Looked at after another process's mkdir,
a workdir that did not exist passed for one that did, and a failed start left it behind, empty.

`take_workdir` returns what the workdir held before, for a failed start to leave it as it was
(run_start.undo_failed_start); a taking that another process failed removes the folder this one
created for it.
"""

from __future__ import annotations

import contextlib
import pathlib

import ml_collections

from jaxformer.data.sources import check_source
from jaxformer.errors import UserError
from jaxformer.files import not_a_folder_reason
from jaxformer.run.lock import WorkdirLock
from jaxformer.training import processes, run_start


def take_workdir(
    data: ml_collections.ConfigDict, workdir: pathlib.Path
) -> tuple[set[pathlib.Path] | None, WorkdirLock]:
    """(the workdir's entries before it was taken, None where there was no workdir; its lock,
    held). `data`: the run's data section, whose source every host checks as it looks."""
    made = []  # the workdir, once this process has created it

    def look() -> set | None:  # what one host alone may fail at: its data_dir, its view of the workdir
        check_source(data)
        return set(workdir.iterdir()) if workdir.is_dir() else None  # what a failed start must leave as it was

    def make_workdir() -> None:
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            reason = not_a_folder_reason(workdir) or error.strerror  # a file there: not mkdir's "File exists"
            raise UserError(f"cannot create the workdir {workdir}: {reason}") from None
        made.extend([workdir] if existed is None else [])

    try:
        # Every process looks before any creates the folder (the module's doc says why).
        existed = processes.all_or_none(look)
        processes.all_or_none(make_workdir)
        return existed, run_start.hold_workdir(workdir)
    except (processes.AnotherProcessError, processes.WorkdirNotSharedError):
        for folder in made:  # no run's (nothing is in it)
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
