"""The training loop's metrics: each step's device metrics collected, fetched once per log
interval (never per step), checked finite, and written as one summary (metrics.jsonl, TensorBoard,
the progress bar)."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

import jax
import numpy as np
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


class TrainMetrics:
    """Collects each step's device metrics; `flush` fetches them, checks the loss is finite,
    and writes one summary (metrics.jsonl, TensorBoard, the progress bar)."""

    def __init__(self, writer: MetricWriter, checkpointer: Checkpointer, progress: tqdm.tqdm):
        self.writer, self.checkpointer, self.progress = writer, checkpointer, progress
        self.pending: list[tuple[int, Any]] = []
        self.last: dict[str, float] | None = None
        self.interval_start = time.perf_counter()

    def add(self, step: int, metrics: Any) -> None:
        self.pending.append((step, metrics))

    def restart_interval(self) -> None:
        """After work between steps (evaluation, BLEU, a checkpoint), flushed before it: the next
        summary's tokens and steps per second time the training steps alone."""
        if not self.pending:
            self.interval_start = time.perf_counter()

    def flush(self, step: int | None = None) -> None:
        if not self.pending:
            return
        host, self.pending = jax.device_get(self.pending), []
        self._check_finite(host)
        elapsed = time.perf_counter() - self.interval_start
        self.interval_start = time.perf_counter()
        totals = {key: sum(float(m[key]) for _, m in host) for key in host[0][1]}
        summary = summarize(totals)
        summary.update(
            learning_rate=float(host[-1][1]["learning_rate"]),
            grad_norm=float(np.mean([m["grad_norm"] for _, m in host])),
            tokens_per_second=totals["weight"] / elapsed,
            steps_per_second=len(host) / elapsed,
        )
        self.writer.write(host[-1][0], summary, prefix="train/")
        self.last = summary
        self.progress.set_postfix(
            loss=f"{summary['loss']:.3f}",
            lr=f"{summary['learning_rate']:.2e}",
            tok_s=f"{summary['tokens_per_second']:,.0f}",
        )
        if self.progress.disable and jax.process_index() == 0:  # no bar (a redirected log): the bar's figures as a line
            logger.info(
                "step %d: training loss %.4f, learning rate %.2e, %s tokens/s",
                host[-1][0],
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
