"""Periodic work in the training loop (log, evaluate, BLEU, checkpoint) under one rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


def itstime(step: int, every_steps: int, last_step: int, at_last_step: bool = True) -> bool:
    """True every `every_steps` steps and, with `at_last_step`, at the last step (as big_vision's
    `itstime`); never when `every_steps` is 0."""
    if every_steps <= 0:
        return False
    return step % every_steps == 0 or (at_last_step and step == last_step)


@dataclasses.dataclass(frozen=True)
class Periodic:
    """`action(step)` every `every_steps` steps (and at the last step if `at_last_step`)."""

    name: str
    every_steps: int
    action: Callable[[int], None]
    at_last_step: bool = True


def run_due(actions: list[Periodic], step: int, last_step: int) -> None:
    """Runs, in list order, the actions due at `step`."""
    for periodic in actions:
        if itstime(step, periodic.every_steps, last_step, periodic.at_last_step):
            periodic.action(step)
