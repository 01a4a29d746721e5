"""A metrics write that fails in process 0 of several (metrics.py's MetricWriter alone writes there):
held, then raised in every process at a point they share, where it was raised in process 0 alone and
left the others waiting in their next collective until jax's timeout aborted both. Faked here as
each process sees the exchange; two real processes: test_metrics_failure_processes.py (slow)."""

import json

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from jaxformer.run.directory import RunDirectory
from jaxformer.training import metrics, tensorboard
from jaxformer.training.metrics import MetricsFailedElsewhereError, MetricWriter, write_last_metrics_in_process_0
from jaxformer.training.signals import StopRequest
from jaxformer.training.step_exchange import raise_held_write, stops_after
from tests.training.test_step_exchange import Saves, TwoProcesses

FULL = OSError(28, "No space left on device")


def full_disk_from(step, monkeypatch):
    """TensorBoard's writes fail from `step` on, as on a full disk."""
    original = tensorboard.ScalarEventWriter.write

    def write(self, at, scalars, wall_time=None):
        if at >= step:
            raise FULL
        original(self, at, scalars, wall_time)

    monkeypatch.setattr(tensorboard.ScalarEventWriter, "write", write)


def test_process_0_holds_a_failed_write_until_the_exchange_raises_it(tmp_path, monkeypatch, caplog):
    processes = TwoProcesses(monkeypatch)
    full_disk_from(3, monkeypatch)
    writer = MetricWriter(tmp_path, enabled=True)  # process 0's
    sent = []
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", lambda value: sent.append(value) or value)
    for step in range(1, 6):
        writer.write(step, {"loss": 1.0 / step}, prefix="train/")
    assert writer.held is FULL and "writing the metrics of step 3 failed (OSError: [Errno 28]" in caplog.text
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # step 3's line, then TensorBoard's write failed; none after it
    with StopRequest() as stop:
        assert not stops_after(9, 10, stop, Saves(None), writer)  # no exchange between them
        with pytest.raises(OSError) as raised:
            stops_after(10, 10, stop, Saves(None), writer)
    assert raised.value is FULL and processes.gathered == [[0, 1, 0]]
    assert bytes(sent[0]).rstrip(b"\0").decode() == "OSError: [Errno 28] No space left on device"
    writer.close()


def test_the_other_processes_raise_process_0s_error_where_they_share_a_point(tmp_path, monkeypatch):
    processes = TwoProcesses(monkeypatch)
    told = b"OSError: [Errno 28] No space left on device".ljust(1024, b"\0")
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", lambda value: np.frombuffer(told, np.uint8))
    writer = MetricWriter(tmp_path, enabled=False)  # process 1's: writes nothing
    processes.other = 1  # as process 1 sees it: process 0 held a failed write
    with pytest.raises(MetricsFailedElsewhereError) as raised:
        raise_held_write(writer)  # before a checkpoint, or after the loop's last records
    assert str(raised.value) == (
        "process 0 of the run failed to write its metrics: OSError: [Errno 28] No space left on device"
    )


def test_one_process_raises_a_failed_write_at_once(tmp_path, monkeypatch):
    full_disk_from(1, monkeypatch)
    writer = MetricWriter(tmp_path, enabled=True)
    with pytest.raises(OSError, match="No space left"):
        writer.write(1, {"loss": 1.0})
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda value: pytest.fail("a collective"))
    raise_held_write(writer)
    assert jax.process_count() == 1


def test_a_failed_write_of_last_metrics_is_raised_in_every_process(tmp_path, monkeypatch):
    """last_metrics.json is written after the run's last collective: process 0's failure is exchanged
    once more, where it ended process 0 alone and the others waited for it in the run's summary."""
    processes = TwoProcesses(monkeypatch)
    processes.other = 0  # process 1 writes nothing, so fails nothing
    told = b"OSError: [Errno 28] No space left on device".ljust(1024, b"\0")
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", lambda value: np.frombuffer(told, np.uint8))
    run, last = RunDirectory(tmp_path), {"step": 5, "first_step": 0}
    assert write_last_metrics_in_process_0(run, last) == last and processes.gathered == [0]
    assert json.loads(run.last_metrics_file.read_text()) == last

    def full_disk(path, text):
        raise FULL

    monkeypatch.setattr(metrics, "write_text_atomically", full_disk)
    with pytest.raises(OSError) as raised:
        write_last_metrics_in_process_0(run, {**last, "step": 6})
    assert raised.value is FULL and processes.gathered == [0, 1]
    monkeypatch.setattr(jax, "process_index", lambda: 1)  # as process 1 sees it: process 0 failed
    processes.other = 1
    with pytest.raises(MetricsFailedElsewhereError, match="^process 0 of the run failed to write its metrics: OSError"):
        write_last_metrics_in_process_0(run, {**last, "step": 6})
    assert json.loads(run.last_metrics_file.read_text()) == last  # the earlier one, as it was
