"""Metric sinks: one JSON line per record in `<workdir>/metrics.jsonl` and TensorBoard event
files in `<workdir>/tensorboard` (tensorboard.py; no TensorFlow needed)."""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.errors import UserError, first_line
from jaxformer.files import write_text_atomically
from jaxformer.run.directory import RunDirectory
from jaxformer.training.tensorboard import ScalarEventWriter

logger = logging.getLogger(__name__)
_REASON_BYTES = 1024  # of process 0's failed write, passed on to the others whole up to this length


class MetricsFailedElsewhereError(UserError):
    """Process 0 of the run, which alone writes its metrics, failed to write them."""


def _record(line: bytes) -> dict | None:
    """The JSON object on `line`, or None when it holds none."""
    try:
        value = json.loads(line)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def _read_lines(path: pathlib.Path) -> list[tuple[bytes, dict | None]]:
    """The lines of the JSONL file `path` (none when it is absent), each with its record (`_record`)."""
    if not path.exists():
        return []
    with open(path, "rb") as handle:
        return [(line, _record(line)) for line in handle]


def _cut_torn_end(path: pathlib.Path, lines: list[tuple[bytes, dict | None]]) -> int:
    """`cut_torn_last_line` on `path`, whose `lines` (`_read_lines`) are already read; the lines
    cut off are removed from `lines`."""
    bad_lines = [number for number, (_, record) in enumerate(lines[:-1], 1) if record is None]
    if bad_lines:
        logger.warning(
            "%s: %d line(s) in the middle are not JSON records (line %s%s); left as they are",
            path,
            len(bad_lines),
            bad_lines[0],
            " and more" if len(bad_lines) > 1 else "",
        )
    if not lines or (lines[-1][0].endswith(b"\n") and lines[-1][1] is not None):
        return 0
    last_line = lines.pop()[0]
    last_start = sum(len(line) for line, _ in lines)
    offset = last_start + len(last_line)
    with open(path, "r+b") as handle:
        handle.truncate(last_start)
        handle.flush()
        os.fsync(handle.fileno())
    preview = last_line[:80] + (b"..." if len(last_line) > 80 else b"")
    logger.warning(
        "%s: cut off a torn last line, bytes %d-%d (%d bytes: %r), before appending",
        path,
        last_start,
        offset,
        offset - last_start,
        preview,
    )
    return offset - last_start


def cut_torn_last_line(path: str | pathlib.Path) -> int:
    """Cuts a torn last line (no line break at its end, or not a JSON object) off a JSONL file,
    as a full disk or a crash mid-write leaves it, so that appending starts on a line of its own.
    Returns the number of bytes removed. Earlier lines are never changed; a bad one among them
    is only reported. Warnings name the file."""
    path = pathlib.Path(path)
    return _cut_torn_end(path, _read_lines(path))


def move_records(path: str | pathlib.Path, moves: Callable[[dict], bool], destination: str | pathlib.Path) -> int:
    """Moves the records that `moves` picks from the JSONL file `path` to the end of `destination`
    (lines that are not records stay); returns how many moved. `path` is replaced whole (written
    beside it, then renamed), so a crash leaves the old or the new file."""
    path = pathlib.Path(path)
    return _move_lines(path, _read_lines(path), moves, pathlib.Path(destination))[0]


def _move_lines(
    path: pathlib.Path, lines: list[tuple[bytes, dict | None]], moves: Callable[[dict], bool], destination: pathlib.Path
) -> tuple[int, list[dict]]:
    """`move_records` on `path`, whose `lines` (`_read_lines`) are already read; returns how many
    moved and the records kept, in file order."""
    kept, moved = [], []
    for line, record in lines:
        (moved if record is not None and moves(record) else kept).append((line, record))
    if moved:
        with open(destination, "ab") as handle:  # first, so that no record is ever in neither file
            handle.writelines(line for line, _ in moved)
            handle.flush()
            os.fsync(handle.fileno())
        staging = path.with_name(f".{path.name}.moving")
        with open(staging, "wb") as handle:
            handle.writelines(line for line, _ in kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    return len(moved), [record for _, record in kept if record is not None]


def metric_names(record: Mapping[str, Any]) -> frozenset[str]:
    """What a record measures (its kind: a train/ summary, an evaluation, BLEU, a budget reading)."""
    return frozenset(record) - {"step", "time"}


class MetricWriter:
    """Writes scalars for a step to JSONL and TensorBoard; only process 0 writes.

    Opening an existing `metrics.jsonl` first cuts off a torn last line (`cut_torn_last_line`),
    then, for a run that starts at `start_step` (the checkpoint it resumed from, -1 for a new one:
    every record is then of an earlier start that saved no checkpoint, step 0's evaluation included),
    moves the records of later steps, written by a segment that stopped before its next
    checkpoint and trained again now, to `metrics.rolled_back.jsonl`: metrics.jsonl keeps one
    record of each step's metrics, those of the parameters the run went on from. A record of
    `start_step` itself (a run resumed from an interim checkpoint with its length shortened to or
    past it does that step's evaluation, BLEU and train/ summary) moves an earlier one of the same
    metrics there too: that step's work was done before the stop, or before a kill cut the end short."""

    def __init__(self, workdir: str | pathlib.Path, enabled: bool | None = None, start_step: int | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        # With several processes a failed write is held until every process raises it at a point they
        # share (raise_held): raised in process 0 alone, it left the others waiting in their next
        # collective, and process 0 for them, until jax's timeout aborted both minutes later.
        self.held: Exception | None = None
        self._holds = self.enabled and jax.process_count() > 1
        self._jsonl = None
        self._tensorboard = None
        self._start_step = start_step
        self.records_at_start: list[dict] = []  # the records of start_step metrics.jsonl held at the start
        moved = 0
        if self.enabled:
            run = self._run = RunDirectory(workdir)
            lines = _read_lines(run.metrics_file)  # read once: every step below works on these lines
            _cut_torn_end(run.metrics_file, lines)
            if start_step is not None:
                moved, kept = _move_lines(
                    run.metrics_file,
                    lines,
                    lambda record: isinstance(record.get("step"), int) and record["step"] > start_step,
                    run.rolled_back_metrics_file,
                )
                if moved:
                    logger.warning(
                        "%s: moved %d record(s) of %s, which this run trains again, to %s",
                        run.metrics_file,
                        moved,
                        f"steps after {start_step}"
                        if start_step >= 0
                        else "earlier runs with no checkpoint to resume from",
                        run.rolled_back_metrics_file,
                    )
                self.records_at_start = [record for record in kept if record.get("step") == start_step]
            self._jsonl = open(run.metrics_file, "a", encoding="utf-8")
            # Created once something is written (a finished run started again writes nothing), or now
            # where records were moved: TensorBoard must drop the steps trained again all the same.
            first_step = None if start_step is None else start_step + 1
            self._tensorboard = ScalarEventWriter(run.tensorboard_dir, first_step, open_now=bool(moved))

    def write(self, step: int, scalars: Mapping[str, float], prefix: str = "") -> None:
        if not self.enabled or self.held is not None:
            return
        values = {f"{prefix}{name}": float(np.asarray(value)) for name, value in scalars.items()}
        record = {
            "step": int(step),
            "time": time.time(),
            **_strict_json(values),
        }
        try:
            if step == self._start_step and metric_names(record) in self._earlier_at_start():
                self.move_earlier(int(step), metric_names(record))
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
            self._tensorboard.write(int(step), values)
        except Exception as error:
            if not self._holds:
                raise
            self.held = error
            logger.error(
                "writing the metrics of step %d failed (%s): no more are written; every process stops with "
                "this error at the next step they share, before any checkpoint (resumed, the run writes them)",
                step,
                first_line(error),
            )

    def raise_held(self, held: np.ndarray) -> None:
        """`held`: every process's `self.held is not None`, gathered at a point they share. When process
        0 held a failed write, raises it there and, in the others, MetricsFailedElsewhereError quoting
        it (`raise_failed_write`)."""
        raise_failed_write(self.held, held)

    def _earlier_at_start(self) -> set[frozenset[str]]:
        """What the records of start_step that metrics.jsonl still holds from before this run measure."""
        return {metric_names(record) for record in self.records_at_start}

    def move_earlier(self, step: int, names: frozenset[str]) -> None:
        """Moves the earlier records of `step` that measure `names` to metrics.rolled_back.jsonl, and
        tells TensorBoard to drop the step's events and take the records metrics.jsonl keeps again."""
        self.records_at_start = [record for record in self.records_at_start if metric_names(record) != names]
        run = self._run
        self._jsonl.close()  # the file is replaced: appending goes on in the new one
        moved, kept = _move_lines(
            run.metrics_file,
            _read_lines(run.metrics_file),
            lambda record: record.get("step") == step and metric_names(record) == names,
            run.rolled_back_metrics_file,
        )
        self._jsonl = open(run.metrics_file, "a", encoding="utf-8")
        logger.warning(
            "%s: moved %d record(s) of step %d (%s), which this run writes again, to %s",
            *(run.metrics_file, moved, step, ", ".join(sorted(names)), run.rolled_back_metrics_file),
        )
        self._tensorboard.restart_at(step)
        for record in kept:
            if record.get("step") == step:
                self._tensorboard.write(
                    step, {name: float(record[name]) for name in metric_names(record)}, record.get("time")
                )

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tensorboard.close()


def perplexity_text(value: float) -> str:
    """A perplexity for a log line: two decimals, or three significant digits once it is large (a
    diverging run's reaches dozens of digits)."""
    return f"{value:.2f}" if value < 1e6 else f"{value:.3g}"


def summarize(totals: Mapping[str, float]) -> dict[str, float]:
    """Per-token averages from summed metrics: the label-smoothed loss, the perplexity
    exp(unsmoothed negative log-likelihood), accuracy, and R-Drop's divergence when trained with it."""
    weight = max(float(totals["weight"]), 1.0)
    nll = float(totals["nll_sum"]) / weight
    summary = {
        "loss": float(totals["loss_sum"]) / weight,
        "nll": nll,
        "perplexity": math.exp(nll) if nll < 700.0 else math.inf,  # exp overflows a double past ~709
        "accuracy": float(totals["correct"]) / weight,
    }
    if "consistency_sum" in totals:  # R-Drop's divergence (output_loss.py), part of the loss
        summary["consistency"] = float(totals["consistency_sum"]) / weight
    return summary


# The entries of last_metrics.json that metrics.jsonl logs, each as records of its prefix told
# apart by a key of their own (validation loss and BLEU are both "eval/" figures, in records of
# their own).
LOGGED_FIGURES = {"train": ("train/", "train/loss"), "eval": ("eval/", "eval/loss"), "bleu": ("eval/", "eval/bleu")}


_NON_FINITE = ("inf", "-inf", "nan")  # how metrics.jsonl writes them (_strict_json)


def metric_records(run: RunDirectory) -> Iterator[dict]:
    """metrics.jsonl's records in order (none where it is absent), a line that holds none (torn: the
    run's MetricWriter cuts or names it) skipped. metrics.jsonl holds the records of the steps the
    run went on from (a resumed run moved those of the steps it trained again to metrics.rolled_back.jsonl)."""
    if not run.metrics_file.is_file():
        return
    with open(run.metrics_file, "rb") as handle:
        for line in handle:
            if (record := _record(line)) is not None:
                yield record


def logged_figures(run: RunDirectory, step: int) -> dict[str, dict[str, float]]:
    """The LOGGED_FIGURES that metrics.jsonl records at `step` (the last record of each, as the
    process that measured it kept)."""
    figures: dict[str, dict[str, float]] = {}
    for record in metric_records(run):
        if record.get("step") != step:
            continue
        for name, (prefix, marker) in LOGGED_FIGURES.items():
            if marker in record:
                figures[name] = {
                    key.removeprefix(prefix): float(value)
                    for key, value in record.items()
                    if key.startswith(prefix) and (isinstance(value, (int, float)) or value in _NON_FINITE)
                }
    return figures


# What a process that trained no step takes from the earlier last_metrics.json of its step: the
# figures of the process that trained to it (its start, its seconds), not its own start at the end.
_TRAINED_BY = ("first_step", "train_seconds")


def write_last_metrics(run: RunDirectory, last: dict[str, Any]) -> dict[str, Any]:
    """Writes `last` (the figures of a training process: its step range, its last train, eval and
    BLEU metrics, its final choice) to last_metrics.json, whole or not at all (a sweep reads it),
    and returns what was written. A process that trained no step (a finished run started again,
    one killed after its last checkpoint, or during its final choice) keeps the earlier figures it
    did not measure anew: they are still the run's, from an earlier last_metrics.json of that
    step or else from metrics.jsonl's records of it; not what the earlier process itself met (its
    signal, the setting that shortened the run as it resumed). From an earlier last_metrics.json it
    keeps `first_step` and `train_seconds` too, those of the process that trained to the step; the
    file is left as it was where nothing else differs (a finished run started again), else the
    keys that change are logged. What is returned has this process's `first_step` (its summary's
    progress, 0 steps)."""
    own_start = last["first_step"]
    if last["step"] == own_start:
        earlier = None
        if run.last_metrics_file.is_file():
            try:
                earlier = json.loads(run.last_metrics_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
        if not (isinstance(earlier, dict) and earlier.get("step") == last["step"]):
            earlier = {}
        as_it_was = dict(earlier)
        # This process's own signal, or the setting that shortened the run at its start, if any, is in
        # `last`: a finished run started again was not shortened again.
        for own in ("stopped_by_signal", "signal_once_complete", "shortened_by"):
            earlier.pop(own, None)
        trained_by = {key: earlier[key] for key in _TRAINED_BY if key in earlier}
        last = {**logged_figures(run, last["step"]), **earlier, **last, **trained_by}
        if as_it_was:
            written = _strict_json(last)  # as the file holds it
            changed = sorted(key for key in {*written, *as_it_was} if written.get(key) != as_it_was.get(key))
            if not changed:
                logger.info(
                    "%s: kept as it was (this run trained no step, and measured nothing anew)", run.last_metrics_file
                )
                return {**last, "first_step": own_start}
            logger.info(
                "%s: %s written anew, the rest kept as it was (this run trained no step)",
                *(run.last_metrics_file, ", ".join(changed)),
            )
    write_text_atomically(run.last_metrics_file, json.dumps(_strict_json(last), indent=2))
    return {**last, "first_step": own_start}


def raise_failed_write(failure: Exception | None, held: np.ndarray) -> None:
    """`held`: every process's `failure is not None` (a write of process 0's that failed: only process 0
    writes), gathered at a point they share. When it holds one, raises `failure` in process 0 and, in
    the others, MetricsFailedElsewhereError quoting it (then a collective: process 0 sends its error)."""
    if not np.asarray(held).any():
        return
    text = "" if failure is None else first_line(failure)
    sent = np.frombuffer(text.encode()[:_REASON_BYTES].ljust(_REASON_BYTES, b"\0"), np.uint8)
    told = bytes(np.asarray(multihost_utils.broadcast_one_to_all(sent))).rstrip(b"\0").decode(errors="replace")
    if failure is not None:
        raise failure
    raise MetricsFailedElsewhereError(f"process 0 of the run failed to write its metrics: {told}")


def write_last_metrics_in_process_0(run: RunDirectory, last: dict[str, Any]) -> dict[str, Any]:
    """`write_last_metrics` in process 0, which alone writes it; returns what was written there, `last`
    in the others. With several processes, a failed write is raised in every one (`raise_failed_write`):
    written after the run's last collective, it ended process 0 alone, and the others, which went on
    to the run's summary (orbax's checkpoint managers wait for every process as they open), waited
    for it there, and it for them in jax's shutdown, until timeouts ended both minutes later."""
    if jax.process_count() == 1:
        return write_last_metrics(run, last)
    failure = None
    if jax.process_index() == 0:
        try:
            last = write_last_metrics(run, last)
        except Exception as error:  # noqa: BLE001  (a bug too: the others must not wait for this process)
            failure = error
    raise_failed_write(failure, np.asarray(multihost_utils.process_allgather(np.int32(failure is not None))))
    return last


def _strict_json(value: Any) -> Any:
    """`value` with each float JSON cannot hold (inf, nan: a diverged run's perplexity) as its
    repr, as metrics.jsonl writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(item) for item in value]
    return value
