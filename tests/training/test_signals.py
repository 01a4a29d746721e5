import logging
import os
import signal

import pytest

from jaxformer.errors import exit_code_for_signal
from jaxformer.training.signals import StopRequest


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_recorded_not_fatal(signum):
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signum)
        assert stop.requested and stop.signum == signum and stop.signal_name == signum.name
    assert exit_code_for_signal(stop.signum) == 128 + signum
    assert signal.getsignal(signum) is not stop._handle  # handlers restored


def test_a_second_ctrl_c_stops_at_once():
    with StopRequest() as stop, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_during_the_final_choice_a_signal_stops_at_once(signum):
    from jaxformer.training.signals import RaiseOnSignal, Stopped

    before = signal.getsignal(signum)
    with pytest.raises(Stopped) as stopped, RaiseOnSignal():
        os.kill(os.getpid(), signum)
        raise AssertionError("went on after the signal")
    assert stopped.value.signum == signum and str(stopped.value) == signum.name
    assert signal.getsignal(signum) == before  # handlers restored


def test_a_stop_that_a_callback_swallowed_is_raised_again():
    """Python prints and drops an exception raised inside a garbage-collection callback (the
    handler can run there): the signal is kept, and `check()` raises it."""
    from jaxformer.training.signals import RaiseOnSignal, Stopped

    with pytest.raises(Stopped) as stopped, RaiseOnSignal() as signals:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Stopped:
            pass  # as the callback's caller does
        signals.check()
    assert stopped.value.signum == signal.SIGTERM
    with RaiseOnSignal() as quiet:
        quiet.check()  # no signal: nothing raised


def test_one_process_agrees_with_itself():
    with StopRequest() as stop:
        assert not stop.agreed(7, every=10)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed(7, every=10)  # one process: at once, whatever the step


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_run_prepares_stops_it_at_once_as_a_failed_start(tmp_path, monkeypatch, caplog, signum):
    """Before the loop takes signals as requests to stop at a step, one stops the preparation
    (data, tokenizers, compilation) at once: said, the workdir unlocked and left as it was."""
    from jaxformer.run.directory import RunDirectory
    from jaxformer.training import loop, run_start
    from jaxformer.training.config_file import load_config

    config = load_config("tiny")
    config.data.data_dir = str(tmp_path / "data")
    workdir = tmp_path / "run"

    def stop_while_preparing(*args):
        assert RunDirectory(workdir).lock_file.exists()  # the run's own preparation, its workdir locked
        signal.raise_signal(signum)

    monkeypatch.setattr(run_start, "check_same_run", stop_while_preparing)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    with caplog.at_level(logging.WARNING):
        assert loop.train_and_evaluate(config, workdir) == {"stopped_by_signal": signum}
    assert not workdir.exists()  # made by this start, and nothing in it to keep
    name = signal.Signals(signum).name
    assert (
        f"stopped by {name} before training began: nothing to save; exiting with {exit_code_for_signal(signum)}"
        in caplog.text
    )
    assert {number: signal.getsignal(number) for number in handlers} == handlers  # given back


def test_the_train_command_exits_with_the_signals_code_when_stopped_while_preparing(tmp_path, monkeypatch, capsys):
    from jaxformer.commands import train
    from jaxformer.training import run_start

    monkeypatch.setattr(run_start, "check_same_run", lambda *args: signal.raise_signal(signal.SIGTERM))
    workdir = tmp_path / "run"
    code = train.main(["--config", "tiny", "--workdir", str(workdir), f"--config.data.data_dir={tmp_path / 'data'}"])
    assert code == exit_code_for_signal(signal.SIGTERM) == 143
    assert "W stopped by SIGTERM before training began: nothing to save; exiting with 143" in capsys.readouterr().err
    assert not workdir.exists()
