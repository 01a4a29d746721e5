"""The training loop's metrics: each step's device metrics collected, fetched once per log
interval (never per step), checked finite, and written as one summary (metrics.jsonl, TensorBoard,
the progress bar)."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import tqdm

from jaxformer.errors import UserError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.training.metrics import MetricWriter, summarize

logger = logging.getLogger(__name__)


def progress_bar(total: int, initial: int) -> tqdm.tqdm:
    """The training bar: on process 0's terminal only, so that a redirected log gets its figures as
    a line every log interval instead (TrainMetrics.flush); a terminal that reports no width
    (a pseudo-terminal never sized) counts as none, as tqdm would draw nothing there."""
    disable = True if jax.process_index() != 0 else None  # None: tqdm's own test, a terminal
    try:
        if os.get_terminal_size(sys.stderr.fileno()).columns == 0:
            disable = True
    except (OSError, ValueError, AttributeError):  # not a terminal, or no descriptor (a captured stream)
        pass
    return tqdm.tqdm(total=total, initial=initial, desc="train", unit="step", disable=disable, dynamic_ncols=True)


class NonFiniteLossError(UserError, FloatingPointError):
    """The training loss became NaN or infinite; the run stops without saving."""


class TrainWindow:
    """The summed metrics of the steps of one log interval not yet written. A checkpoint saved
    between log steps (to stop: a signal, unreadable data) stores it (`to_json`), and the resumed
    run goes on adding to it, so that the interval's record is the one a run never stopped writes.
    Each step's values are added in step order, one at a time: the same sums, bit for bit, whether
    or not the interval was split by a stop."""

    def __init__(
        self,
        steps: int = 0,
        last_step: int = 0,
        sums: dict[str, float] | None = None,
        learning_rate: float = 0.0,
        seconds: float = 0.0,
    ):
        self.steps, self.last_step, self.sums = steps, last_step, dict(sums or {})
        self.learning_rate = learning_rate  # the last step's
        self.seconds = seconds  # the training seconds of its steps before the stop (the resumed run's are timed anew)

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.steps, self.last_step, self.learning_rate = self.steps + 1, step, float(metrics["learning_rate"])

    def to_json(self, seconds: float) -> dict[str, Any]:
        """As CheckpointMetadata.train_window holds it; `seconds`: those of its steps so far."""
        return {
            "steps": self.steps,
            "last_step": self.last_step,
            "sums": dict(self.sums),
            "learning_rate": self.learning_rate,
            "seconds": seconds,
        }

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> TrainWindow:
        return cls(values["steps"], values["last_step"], values["sums"], values["learning_rate"], values["seconds"])


class TrainMetrics:
    """Collects each step's device metrics; `flush` fetches them, checks the loss is finite,
    and writes one summary (metrics.jsonl, TensorBoard, the progress bar). `window`: the steps
    of the log interval that an interim checkpoint saved (`for_checkpoint`), which a resumed run
    goes on from."""

    def __init__(
        self,
        writer: MetricWriter,
        checkpointer: Checkpointer,
        progress: tqdm.tqdm,
        window: Mapping[str, Any] | None = None,
    ):
        self.writer, self.checkpointer, self.progress = writer, checkpointer, progress
        self.pending: list[tuple[int, Any]] = []
        self.window = None if window is None else TrainWindow.from_json(window)  # fetched, not yet written
        self.last: dict[str, float] | None = None
        self.interval_start = time.perf_counter()

    def add(self, step: int, metrics: Any) -> None:
        self.pending.append((step, metrics))

    def restart_interval(self) -> None:
        """After work between steps (evaluation, BLEU, a checkpoint), flushed before it: the next
        summary's tokens and steps per second time the training steps alone."""
        if not self.pending and self.window is None:
            self.interval_start = time.perf_counter()

    def _fetch(self) -> TrainWindow | None:
        """The window with the pending steps' metrics fetched (once per interval) and added."""
        if self.pending:
            host, self.pending = jax.device_get(self.pending), []
            self._check_finite(host)
            self.window = self.window or TrainWindow()
            for step, metrics in host:
                self.window.add(step, metrics)
        return self.window

    def for_checkpoint(self, interim: bool) -> dict[str, Any] | None:
        """What a checkpoint stores of the interval since the last summary, its steps checked
        finite first (never checkpoint past a NaN). A scheduled checkpoint (and the run's last)
        writes the summary, as a run never stopped does there, and stores nothing; an interim one,
        which stops the run between log steps, stores the window and writes nothing."""
        if not interim:
            self.flush()
            return None
        window = self._fetch()
        if window is None:
            return None
        return window.to_json(window.seconds + time.perf_counter() - self.interval_start)

    def flush(self, step: int | None = None) -> None:
        window, self.window = self._fetch(), None
        if window is None:
            return
        elapsed = window.seconds + time.perf_counter() - self.interval_start
        self.interval_start = time.perf_counter()
        summary = summarize(window.sums)
        summary.update(
            learning_rate=window.learning_rate,
            grad_norm=window.sums["grad_norm"] / window.steps,
            tokens_per_second=window.sums["weight"] / elapsed,
            steps_per_second=window.steps / elapsed,
        )
        self.writer.write(window.last_step, summary, prefix="train/")
        self.last = summary
        self.progress.set_postfix(
            loss=f"{summary['loss']:.3f}",
            lr=f"{summary['learning_rate']:.2e}",
            tok_s=f"{summary['tokens_per_second']:,.0f}",
        )
        if self.progress.disable and jax.process_index() == 0:  # no bar (a redirected log): the bar's figures as a line
            logger.info(
                "step %d: training loss %.4f, learning rate %.2e, %s tokens/s",
                window.last_step,
                summary["loss"],
                summary["learning_rate"],
                f"{summary['tokens_per_second']:,.0f}",
            )

    def _check_finite(self, step_metrics: list[tuple[int, dict]]) -> None:
        for step, metrics in step_metrics:
            loss = float(metrics["loss_sum"]) / max(float(metrics["weight"]), 1.0)
            if not (math.isfinite(loss) and math.isfinite(float(metrics["grad_norm"]))):
                saved = self.checkpointer.steps()
                kept = (
                    f"the last good checkpoint is step {saved[-1]} in {self.checkpointer.directory}"
                    if saved
                    else "no checkpoint was saved"
                )
                raise NonFiniteLossError(
                    f"training loss is {loss} (gradient norm {float(metrics['grad_norm'])}) at step {step}; "
                    f"stopping without saving: {kept}. Lower optimizer.learning_rate_scale or check the data."
                )
