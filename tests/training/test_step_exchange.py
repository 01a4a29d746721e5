"""The one exchange of the training loop every 10 steps with several processes (step_exchange.py):
a failed save, a failed metrics write and a signal told in one collective, where a failed save and
a signal were each one of its own; faked here as process 0 of two sees it, process 1's part given,
and the key-value store in memory. The failed write: test_metrics_held_write.py."""

import os
import signal

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from jaxformer.run.save_barrier import SaveFailedElsewhereError
from jaxformer.training.metrics import MetricWriter
from jaxformer.training.signals import StopRequest
from jaxformer.training.step_exchange import stops_after
from tests.run.test_save_barrier import Store, barriers


class TwoProcesses:
    """jax as process 0 of two sees it: every `process_allgather` recorded, process 1's part of it
    (`other`: whether it has seen a failed save, held a failed write, its signal number) given."""

    def __init__(self, monkeypatch):
        self.gathered, self.other = [], [0, 0, 0]
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(multihost_utils, "process_allgather", self.process_allgather)

    def process_allgather(self, value):
        self.gathered.append(np.asarray(value).tolist())
        return np.stack([np.asarray(value), np.asarray(self.other, np.int32)])


NO_WRITER = MetricWriter("unused", enabled=False)  # a process but 0's, which writes no metrics


class Saves:
    """A checkpointer's part in the exchange: its save barrier, and `wait` for its save under way."""

    def __init__(self, barrier):
        self.barrier, self.waits = barrier, 0

    def wait(self):
        self.waits += 1


def test_a_failed_save_and_a_signal_travel_in_one_collective_every_10_steps(monkeypatch):
    """Each had a `process_allgather` of its own at the same steps: 6 in 30 steps, now 3."""
    processes = TwoProcesses(monkeypatch)
    saves = Saves(barriers(Store())[0])
    with StopRequest() as stop:
        assert not any(stops_after(step, 10, stop, saves, NO_WRITER) for step in range(1, 31))
    assert processes.gathered == [[0, 0, 0], [0, 0, 0], [0, 0, 0]]  # steps 10, 20 and 30: nothing failed, no signal
    assert saves.waits == 0


def test_a_signal_to_another_process_stops_this_one_at_the_next_exchange(monkeypatch, caplog):
    processes = TwoProcesses(monkeypatch)
    processes.other = [0, 0, int(signal.SIGTERM)]
    with StopRequest() as stop:
        assert not stops_after(15, 10, stop, Saves(None), NO_WRITER)  # no exchange between them
        assert stops_after(20, 10, stop, Saves(None), NO_WRITER)
    assert stop.signum == signal.SIGTERM and processes.gathered == [[0, 0, 0]]
    assert "SIGTERM received by another process" in caplog.text


def test_a_failed_save_is_raised_before_a_signal_is_acted_on(monkeypatch):
    """Process 1 failed to save checkpoint 80 and this process received SIGTERM: the failure ends
    the run in both, each waiting for its save (its own error in process 1), with no interim save."""
    processes = TwoProcesses(monkeypatch)
    first, second = barriers(Store())
    second.step = 80
    second.tell(OSError(27, "File too large"))
    processes.other = [1, 0, 0]
    saves = Saves(first)
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(SaveFailedElsewhereError, match="^process 1 of the run failed to save checkpoint 80 in "):
            stops_after(90, 10, stop, saves, NO_WRITER)
    assert processes.gathered == [[1, 0, int(signal.SIGTERM)]] and saves.waits == 1


def test_one_process_stops_at_its_signal_at_any_step_with_no_collective(monkeypatch):
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda value: pytest.fail("a collective"))
    with StopRequest() as stop:
        assert not stops_after(10, 10, stop, Saves(None), NO_WRITER)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops_after(7, 10, stop, Saves(None), NO_WRITER)
