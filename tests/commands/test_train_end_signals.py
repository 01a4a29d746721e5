"""SIGTERM and Ctrl-C once a training run's work is done: noted by the run, then by the launcher's
handlers, which take over before the run's are given back and keep the exit code through the
summary and Python's exit. The handlers in place are called directly, as Python calls them when a
signal arrives (a real one would need a training run in a subprocess)."""

import logging
import signal

import pytest

from jaxformer.commands import launch

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def deliver(signum):
    """Calls the handler in place for `signum`; a default or ignored one fails: the process would
    end of it, as a finished run's did (143) during its summary."""
    handler = signal.getsignal(signum)
    assert callable(handler), f"{signal.Signals(signum).name} would end the process here (its handler: {handler!r})"
    handler(signum, None)


@pytest.fixture
def handlers(monkeypatch):
    """The signal handlers and the launcher's kept exit code, given back after the test."""
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    monkeypatch.setattr(launch, "_finished", [])
    monkeypatch.setattr(launch, "_launching", [], raising=False)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a command's process has it
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_handler_installed_in_a_signal_block_is_left_in_place(handlers):
    """A caller's handler installed while the run's are in place takes over with no moment
    between: the block's exit does not put back the ones it found over it."""
    from jaxformer.training.signals import RaiseOnSignal

    def taker(signum, frame):
        pass

    with RaiseOnSignal() as signals:
        signals.finish()
        signal.signal(signal.SIGTERM, taker)
    assert signal.getsignal(signal.SIGTERM) is taker
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler  # its own: given back


def test_the_launchers_handler_keeps_the_exit_code_and_a_second_signal_ends_the_process(handlers, capsys):
    launch._launching.append("jaxformer.commands.train")  # as launch() has it while the command runs
    launch.keep_exit_code(0)
    deliver(signal.SIGTERM)
    assert capsys.readouterr().err == "SIGTERM came once the command's work was done; exiting with 0\n"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one: at once
    launch.keep_exit_code(0)  # as the command returns: the handlers stay as the first signal left them
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and launch._finished == [0]


def test_a_signal_once_the_run_is_done_changes_nothing_through_the_summary(handlers, tmp_path, monkeypatch, capsys):
    """Sent between the run's end and its summary, or during it: it is said, and the run exits 0
    with its summary (it died of the signal, 143, with nothing lost)."""
    from jaxformer.commands import run_summary
    from jaxformer.training import loop

    def run_done(config, workdir, preparation):  # as _train ends: the run's work done, then a signal
        preparation.finish()
        deliver(signal.SIGTERM)
        return {"step": 4, "first_step": 0, "train_seconds": 1.0}

    def summary_signalled(*args):
        deliver(signal.SIGINT)
        return ["run finished: 4 steps"]

    monkeypatch.setattr(loop, "_locked_train_and_evaluate", run_done)
    monkeypatch.setattr(run_summary, "run_summary", summary_signalled)
    workdir = tmp_path / "run"
    argv = ["--config", "tiny", "--workdir", str(workdir), f"--config.data.data_dir={tmp_path / 'data'}"]
    assert launch.launch("jaxformer.commands.train", argv) == 0
    error = capsys.readouterr().err
    by_the_run = (
        "W SIGTERM received once the run had ended at step 4, which is saved: nothing is left to stop; exiting "
    )
    by_the_launcher = "\nSIGINT came once the command's work was done; exiting with 0\n"
    assert by_the_run + "with 0\n" in error and by_the_launcher in error
    assert error.index(by_the_run) < error.index(by_the_launcher) < error.index("I run finished: 4 steps\n")
    assert launch._finished == [0]


def test_a_run_started_from_python_leaves_its_callers_handlers(handlers, tmp_path, monkeypatch):
    """train.main called from Python (a notebook, a script of the user's), not by the launcher:
    once it returns, a Ctrl-C interrupts the caller as before; the launcher's hand-over, which
    kept the exit code of a process about to end, would have swallowed it."""
    from jaxformer.commands import run_summary, train
    from jaxformer.training import loop

    def run_done(config, workdir, preparation):
        preparation.finish()
        return {"step": 4, "first_step": 0, "train_seconds": 1.0}

    monkeypatch.setattr(loop, "_locked_train_and_evaluate", run_done)
    monkeypatch.setattr(run_summary, "run_summary", lambda *args: ["run finished: 4 steps"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    argv = ["--config", "tiny", "--workdir", str(tmp_path / "run"), f"--config.data.data_dir={tmp_path / 'data'}"]
    assert train.main(argv) == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(KeyboardInterrupt):
        deliver(signal.SIGINT)


@pytest.mark.slow  # a training run (about 10 s); the hand-over to the launcher is tested above without one
def test_a_signal_as_a_real_run_writes_its_last_metrics_is_noted(handlers, data_dir, tmp_path, monkeypatch, caplog):
    """After the loop and the checkpoints' close, as last_metrics.json is written: the run is
    complete, not stopped (it said 'stopped by SIGTERM; resume with the same command', 143)."""
    from jaxformer.training import loop
    from tests.training.test_signals import _four_step_config

    real_write = loop.write_last_metrics_in_process_0

    def write_signalled(run, last):
        deliver(signal.SIGTERM)
        return real_write(run, last)

    monkeypatch.setattr(loop, "write_last_metrics_in_process_0", write_signalled)
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(_four_step_config(data_dir, final_choice=False), tmp_path / "run")
    assert "stopped_by_signal" not in last and last["step"] == 4 and last["signal_once_complete"] == signal.SIGTERM
    note = "SIGTERM received once the run had ended at step 4, which is saved: nothing is left to stop; exiting with 0"
    assert note in caplog.messages and "stopped by" not in caplog.text
    assert (tmp_path / "run" / "last_metrics.json").is_file() and (tmp_path / "run" / "checkpoints" / "4").is_dir()


@pytest.mark.slow  # a training run (about 10 s)
def test_a_second_signal_after_a_stop_before_the_final_choice_keeps_the_runs_end(
    handlers, data_dir, tmp_path, monkeypatch, caplog
):
    """A signal at the last step stops the run before its final choice (143); a second one as
    last_metrics.json is written is noted, not raised: the run's end (that file, the summary) is
    not lost (it raised, and the run ended without them)."""
    from jaxformer.training import loop
    from tests.training.test_signals import _four_step_config

    real_stopped, real_write = loop.stopped_before_the_final_choice, loop.write_last_metrics_in_process_0

    def signalled_at_the_last_step(stop, step, final_choice):
        stop.signum = signal.SIGTERM  # as the handler of the loop's block records one
        return real_stopped(stop, step, final_choice)

    def write_signalled(run, last):
        deliver(signal.SIGTERM)
        return real_write(run, last)

    monkeypatch.setattr(loop, "stopped_before_the_final_choice", signalled_at_the_last_step)
    monkeypatch.setattr(loop, "write_last_metrics_in_process_0", write_signalled)
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(_four_step_config(data_dir, final_choice=True), tmp_path / "run")
    assert last["stopped_by_signal"] == signal.SIGTERM and last["step"] == 4
    assert "SIGTERM received once the run had ended at step 4, which is saved" in caplog.text
    assert (tmp_path / "run" / "last_metrics.json").is_file() and not (tmp_path / "run" / "final").exists()
