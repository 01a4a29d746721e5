"""The final choice as the training loop makes it: minutes of decoding that SIGTERM or Ctrl-C may
stop, leaving the choice to the same command, unless it came as the choice was being closed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from jaxformer.errors import exit_code_for_signal
from jaxformer.run.directory import RunDirectory
from jaxformer.training.final_choice import saved_choice
from jaxformer.training.signals import RaiseOnSignal, Stopped

logger = logging.getLogger(__name__)


def choose_unless_stopped(choose: Callable[..., dict[str, Any]], run: RunDirectory, step: int, last):
    """Runs `choose(check=...)` (the final choice at `step`) with signals raising `Stopped`; its result
    goes to `last["final"]`. With several processes they are raised by `check()`, which `choose`
    calls after each scoring, so that all processes stop together. Returns the signal's number that
    stopped it before it was saved (None: the choice is made; a signal that came as it closed is
    `last["signal_once_complete"]`)."""
    try:
        with RaiseOnSignal(until="once the scoring under way in the final choice is done") as signals:
            last["final"] = choose(check=signals.check)
            signals.check()  # a signal whose exception a garbage-collection callback swallowed
    except Stopped as signal_stop:
        saved = saved_choice(run, step)
        if saved is None:
            logger.warning(
                "stopped by %s during the final choice at step %d (its checkpoint is saved); exiting with %d; "
                "the same command makes the choice",
                *(signal_stop, step, exit_code_for_signal(signal_stop.signum)),  # a Stopped reads as its signal's name
            )
            return signal_stop.signum
        last["final"] = saved  # the signal came as the choice was closed: it is made
        last["signal_once_complete"] = signal_stop.signum  # a sweep stops before its next run
        logger.warning(
            "%s received as the final choice at step %d ended: it is saved, the run is complete; exiting with 0",
            *(signal_stop, step),
        )
    return None
