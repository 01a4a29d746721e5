"""A signal to one process of a multi-process run while it prepares or makes its final choice:
raised in that process alone, it stopped that process in the middle of work whose collectives the
others were still in (a SIGTERM to process 1 during the final choice ended both with orbax's
"sync_global_devices name mismatch" traceback, exit 1; during the preparation both waited for
jax's 5-minute distributed timeout, then aborted). Held until the next point every process checks
at, it now stops all of them there, each exiting 143."""

import os
import signal
import textwrap

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from jaxformer.run.directory import RunDirectory
from jaxformer.training.final_choice_stop import choose_unless_stopped
from jaxformer.training.signals import RaiseOnSignal, Stopped
from tests.run.two_processes import start_two_processes


class OtherProcess:
    """jax as process 0 of two sees it, process 1's signal number (0: none) faked in every exchange."""

    def __init__(self, monkeypatch, signum: int = 0):
        self.exchanged = []
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
        monkeypatch.setattr(multihost_utils, "process_allgather", self.process_allgather)
        self.signum = signum

    def process_allgather(self, value):
        self.exchanged.append(int(value))
        return np.asarray([value, self.signum], np.int32)


def scorings(signum: int | None, done: list):
    """A final choice of three scorings (each one's end appended to `done`), `signum` sent to this
    process during the second."""

    def choose(check=lambda: None):  # without the check, as the loop chose before
        for name in ("latest", "best", "averaged"):
            if name == "best" and signum is not None:
                os.kill(os.getpid(), signum)
            done.append(name)
            check()
        return {"chosen": "latest"}

    return choose


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_final_choice_stops_every_process_after_the_scoring_under_way(
    tmp_path, monkeypatch, caplog, signum
):
    processes = OtherProcess(monkeypatch)
    done, last = [], {}
    assert choose_unless_stopped(scorings(signum, done), RunDirectory(tmp_path), 30, last) == signum
    assert done == ["latest", "best"] and "final" not in last  # its scoring ended, then every process stopped
    assert processes.exchanged == [0, signum]  # told to the other process where it checks too
    name = signal.Signals(signum).name
    assert f"{name} received: stopping once the scoring under way in the final choice is done" in caplog.text

    # The other process, which no signal reached, stops at the same check.
    caplog.clear()
    processes.signum, done = int(signum), []
    assert choose_unless_stopped(scorings(None, done), RunDirectory(tmp_path), 30, last) == signum
    assert done == ["latest"] and f"{name} received by another process" in caplog.text


def test_a_signal_while_preparing_is_held_until_every_process_checks(monkeypatch):
    processes = OtherProcess(monkeypatch)
    with pytest.raises(Stopped) as stopped, RaiseOnSignal(until="where the preparation ends") as preparation:
        os.kill(os.getpid(), signal.SIGTERM)
        preparation.check()
    assert stopped.value.signum == signal.SIGTERM and processes.exchanged == [signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt), RaiseOnSignal(until="where the preparation ends"):  # a second: at once
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    with pytest.raises(Stopped), RaiseOnSignal(until="where the preparation ends"):  # one process: at once
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("went on after the signal")


PROGRAM = textwrap.dedent(
    """
    import faulthandler, os, pathlib, signal, sys
    faulthandler.dump_traceback_later(100, exit=True)  # a hang is a failure with the stack, not a stuck suite
    import jax
    jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    from jax.experimental import multihost_utils
    from jaxformer.run.directory import RunDirectory
    from jaxformer.training.final_choice_stop import choose_unless_stopped

    def choose(check=lambda: None):  # each scoring ends in collectives, as translating sharded parameters does
        for name in ("latest", "best", "averaged"):
            if name == "best" and jax.process_index() == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            multihost_utils.sync_global_devices(name)
            check()
        return {"chosen": "latest"}

    print(choose_unless_stopped(choose, RunDirectory(pathlib.Path(sys.argv[3])), 30, {}))
    """
)


@pytest.mark.slow  # two processes starting jax.distributed, about 5 s; the rule itself is tested above
@pytest.mark.xdist_group("distributed-processes")
def test_a_signal_to_one_of_two_processes_during_the_final_choice_stops_both(tmp_path):
    script = tmp_path / "choose.py"
    script.write_text(PROGRAM)
    processes = start_two_processes(script, str(tmp_path))
    try:
        outputs = [process.communicate(timeout=60) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [process.returncode for process in processes] == [0, 0], [error[-2000:] for _, error in outputs]
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == ["15", "15"]
    assert "SIGTERM received by another process" in outputs[0][1]
