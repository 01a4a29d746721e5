"""Metric sinks: one JSON line per record in `<workdir>/metrics.jsonl` and TensorBoard event
files in `<workdir>/tensorboard` (written by tensorboardX; no TensorFlow needed)."""

from __future__ import annotations

import json
import math
import pathlib
import time
from collections.abc import Mapping

import jax
import numpy as np


class MetricWriter:
    """Writes scalars for a step to JSONL and TensorBoard; only process 0 writes."""

    def __init__(self, workdir: str | pathlib.Path, enabled: bool | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._jsonl = None
        self._tensorboard = None
        if self.enabled:
            workdir = pathlib.Path(workdir)
            self._jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")
            from tensorboardX import SummaryWriter  # imported lazily: only the writing process needs it

            self._tensorboard = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, step: int, scalars: Mapping[str, float], prefix: str = "") -> None:
        if not self.enabled:
            return
        values = {f"{prefix}{name}": float(np.asarray(value)) for name, value in scalars.items()}
        record = {"step": int(step), "time": time.time(), **{k: (v if math.isfinite(v) else repr(v)) for k, v in values.items()}}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        for name, value in values.items():
            self._tensorboard.add_scalar(name, value, int(step))

    def flush(self) -> None:
        if self.enabled:
            self._jsonl.flush()
            self._tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tensorboard.close()


def summarize(totals: Mapping[str, float]) -> dict[str, float]:
    """Per-token averages from summed metrics: the label-smoothed loss, the perplexity
    exp(unsmoothed negative log-likelihood), and accuracy."""
    weight = max(float(totals["weight"]), 1.0)
    nll = float(totals["nll_sum"]) / weight
    return {
        "loss": float(totals["loss_sum"]) / weight,
        "nll": nll,
        "perplexity": math.exp(min(nll, 50.0)),
        "accuracy": float(totals["correct"]) / weight,
    }
