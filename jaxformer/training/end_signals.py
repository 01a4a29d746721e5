"""SIGTERM and Ctrl-C at a training run's end, once its loop has left off. One the loop took at
its last step stops the run before its final choice, which the same command then makes, or, with
none due, stops nothing. Once the run's work is done (its checkpoints written, its final choice
made or left to the same command), one is said in one line and changes nothing: the run's handler
notes it (`RaiseOnSignal.finish`), and a caller's own handler, installed before the run's are
given back (the train command's, commands/launch.py), keeps the exit code through what follows."""

from __future__ import annotations

import logging
import signal
from typing import Any

from jaxformer.errors import exit_code_for_signal
from jaxformer.training.signals import StopRequest

logger = logging.getLogger(__name__)


def stopped_before_the_final_choice(stop: StopRequest, step: int, final_choice: bool) -> bool:
    """Whether a signal that came at the last step, or while its checkpoint was written, stops the
    run before its final choice (minutes of decoding); without one due, the run is complete and the
    line says so. Every process calls it (`stop.agreed`)."""
    if not stop.agreed():
        return False
    if final_choice:
        logger.warning(
            "stopped by %s after the last step, %d (its checkpoint is saved), before the final choice; exiting "
            "with %d; the same command makes the choice",
            *(stop.signal_name, step, exit_code_for_signal(stop.signum)),
        )
        return True
    logger.warning(
        "%s received at the last step, %d, which is done and saved: the run is complete, nothing is left "
        "to stop; exiting with 0",
        *(stop.signal_name, step),
    )
    return False


def with_late_signal(last: dict[str, Any], signum: int | None) -> dict[str, Any]:
    """`last`, a run's result, with `signum`, a signal that came once the run's work was done
    (None: none came), said in one line; a complete run's is `last["signal_once_complete"]` (a
    sweep stops before its next run), and the exit code stays the run's."""
    if signum is None:
        return last
    stopped = last.get("stopped_by_signal")
    logger.warning(
        "%s received once the run had ended at step %d, which is saved: nothing is left to stop; exiting with %d",
        *(signal.Signals(signum).name, last["step"], exit_code_for_signal(stopped) if stopped else 0),
    )
    return last if stopped else {**last, "signal_once_complete": signum}
