"""Periodic work in the training loop (log, evaluate, BLEU, checkpoint) under one rule."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection


def itstime(step: int, every_steps: int, last_step: int, at_last_step: bool = True) -> bool:
    """True every `every_steps` steps and, with `at_last_step`, at the last step (as big_vision's
    `itstime`); never when `every_steps` is 0."""
    if every_steps <= 0:
        return False
    return step % every_steps == 0 or (at_last_step and step == last_step)


@dataclasses.dataclass(frozen=True)
class Periodic:
    """`action(step)` every `every_steps` steps (and at the last step if `at_last_step`).
    `timed`: work a time budget measures apart from the steps (budget.py); `saves`: it saves the
    run, after the budget has been read again when timed work ran before it at the same step."""

    name: str
    every_steps: int
    action: Callable[[int], None]
    at_last_step: bool = True
    timed: bool = False
    saves: bool = False


def run_due(
    actions: list[Periodic],
    step: int,
    last_step: int,
    timed: Callable[[str, float], None] | None = None,
    ends_here: Callable[[], bool] | None = None,
) -> int:
    """Runs, in list order, the actions due at `step`; returns the run's last step: `last_step`,
    or `step` where the work has spent the time budget. `timed(name, seconds)` is told each timed
    action's duration. `ends_here()` is asked before a `saves` action when timed work ran at
    `step`: True makes `step` the last, and the actions due at a last step that have not run, run."""
    done: set[str] = set()

    def run(periodic: Periodic) -> None:
        started = time.monotonic()
        periodic.action(step)
        done.add(periodic.name)
        if periodic.timed and timed is not None:
            timed(periodic.name, time.monotonic() - started)

    for index, periodic in enumerate(actions):
        worked = any(earlier.timed and earlier.name in done for earlier in actions[:index])
        if periodic.saves and ends_here is not None and step != last_step and worked and ends_here():
            last_step = step
            for earlier in actions[:index]:
                if earlier.name not in done and itstime(step, earlier.every_steps, step, earlier.at_last_step):
                    run(earlier)
        if itstime(step, periodic.every_steps, last_step, periodic.at_last_step):
            run(periodic)
    return last_step


def run_at_start(
    actions: list[Periodic], names: Collection[str], timed: Callable[[str, float], None] | None = None
) -> None:
    """Runs, in list order, the actions among `names` that are due at all (`itstime` at step 0: an
    `every_steps` above 0), at step 0: a run that starts from other parameters measures them before
    its first step. `timed` as `run_due`'s (the first of a kind holds its compilation)."""
    run_due([periodic for periodic in actions if periodic.name in names], 0, 0, timed)
