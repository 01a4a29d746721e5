import concurrent.futures
import logging
import os
import signal
import subprocess
import sys
import time
import types

import pytest
from jax.experimental import multihost_utils

from jaxformer.errors import exit_code_for_signal
from jaxformer.training.signals import StopRequest
from jaxformer.training.step_exchange import stops_after
from tests.training.test_step_exchange import NO_WRITER, Saves, TwoProcesses


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_recorded_not_fatal(signum):
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signum)
        assert stop.requested and stop.signum == signum and stop.signal_name == signum.name
    assert exit_code_for_signal(stop.signum) == 128 + signum
    assert signal.getsignal(signum) is not stop._handle  # handlers restored


def test_a_signal_says_the_step_under_way_and_its_work_end_first(caplog):
    """One may come during an evaluation, a BLEU pass, a compilation or between steps, where 'after
    this step' said nothing true: the loop asks after each step's work (with several processes, at
    the steps where they exchange signals), so that step and the work due at it end first."""
    with caplog.at_level(logging.WARNING), StopRequest():
        os.kill(os.getpid(), signal.SIGTERM)
    assert caplog.messages == [
        "SIGTERM received: stopping once the step under way (between steps: the next one) and any evaluation, BLEU "
        "or checkpoint due at it are done; a checkpoint is saved"
    ]
    from jaxformer.training.signals import stop_message

    assert stop_message("SIGINT", 2) == (
        "SIGINT received: stopping at the next step at which all processes exchange signals, once it and any "
        "evaluation, BLEU or checkpoint due at it are done; a checkpoint is saved"
    )


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


def test_one_process_agrees_with_itself_at_once_with_no_collective(monkeypatch):
    """Between steps the loop asks in its exchange every 10 steps, the one place that counts steps:
    one process stops after the step under way, whatever its number."""
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda value: pytest.fail("a collective"))
    with StopRequest() as stop:
        assert not stop.agreed() and not stops_after(7, 10, stop, Saves(None), NO_WRITER)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed() and stops_after(7, 10, stop, Saves(None), NO_WRITER)


def test_a_signal_to_any_process_stops_every_one_where_they_agree(monkeypatch, caplog):
    """Several processes: each call is an exchange (every process calls it at the same point, the
    loop's start and end); between steps the loop exchanges only every 10 steps, the same steps in
    each, so all stop after the same step."""
    processes = TwoProcesses(monkeypatch)
    processes.other = 0
    with StopRequest() as stop:
        assert not stop.agreed()
        processes.other = int(signal.SIGTERM)  # process 1 received one
        assert not stops_after(7, 10, stop, Saves(None), NO_WRITER)  # no exchange at step 7
        assert stop.agreed() and stop.signum == signal.SIGTERM  # taken as this process's own
    assert processes.gathered == [0, 0]
    assert "SIGTERM received by another process: saving a checkpoint and stopping" in caplog.text


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


def _frame_of(module_name):
    return types.SimpleNamespace(f_globals={"__name__": module_name}, f_back=None)


def test_a_signal_inside_jax_is_raised_once_jax_returns():
    """Not inside JAX's (or orbax's) code, whose C++ callers do not expect an exception: the
    signal is held, sent again until the code outside runs, and raised there."""
    from jaxformer.training.signals import RaiseOnSignal, Stopped

    with pytest.raises(Stopped) as stopped, RaiseOnSignal() as signals:
        try:
            signals._handle(signal.SIGTERM, _frame_of("jax._src.compiler"))  # as if it came during a compilation
        except Stopped:
            raise AssertionError("raised inside JAX's code") from None
        assert signals.signum == signal.SIGTERM  # held
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01)  # here, outside JAX: the signal comes again and is raised
        raise AssertionError("the held signal was never raised")
    assert stopped.value.signum == signal.SIGTERM
    # Held when the block's work ends: its check() raises it; a signal after the first is not
    # raised (it would break off the stop's clean-up).
    with pytest.raises(Stopped), RaiseOnSignal() as signals:
        try:
            signals._handle(signal.SIGINT, _frame_of("orbax.checkpoint.checkpoint_manager"))
        except Stopped:
            raise AssertionError("raised inside orbax's code") from None
        signals.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(Stopped), RaiseOnSignal() as signals:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Stopped:
            signals._handle(signal.SIGINT, None)  # a second signal during the clean-up: not raised
            assert signals.signum == signal.SIGTERM
            raise


def test_a_signal_held_inside_a_library_call_is_not_lost_when_the_work_then_fails(caplog):
    """tfds downloads in a thread pool, the main thread waiting in `concurrent`: a signal there is
    held; a download that then fails (offline) must not carry the stop away with its error."""
    from jaxformer.data.parallel_text import DataError
    from jaxformer.training.signals import RaiseOnSignal, Stopped

    def download_that_fails():
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(os.kill, os.getpid(), signal.SIGTERM).result()  # arrives while the main thread waits
        raise DataError("preparing wmt14_translate failed: ConnectionError: no network")

    with pytest.raises(Stopped) as stopped, RaiseOnSignal():
        download_that_fails()
    assert stopped.value.signum == signal.SIGTERM
    assert isinstance(stopped.value.__cause__, DataError)
    assert "SIGTERM: the work it came during then failed (DataError: preparing wmt14_translate failed" in caplog.text
    with pytest.raises(DataError), RaiseOnSignal():  # no signal: the error as it is
        raise DataError("preparing failed")


COMPILE_AND_STOP = """
import os, signal, sys
import jax, jax.numpy as jnp
from jax._src import compiler
from jaxformer.training.signals import RaiseOnSignal, Stopped

original = compiler.backend_compile_and_load
def compile_interrupted(*args, **kwargs):  # SIGTERM arrives while XLA compiles, as a preemption's may
    os.kill(os.getpid(), signal.SIGTERM)
    return original(*args, **kwargs)
compiler.backend_compile_and_load = compile_interrupted
try:
    with RaiseOnSignal():
        jax.jit(lambda x: jnp.tanh(x @ x.T))(jnp.ones((8, 8))).block_until_ready()
        print("compiled", flush=True)
        while True:
            pass
except Stopped as stop:
    print("stopped by", stop, flush=True)
sys.exit(143)
"""


def test_a_signal_during_a_compilation_ends_the_process_with_its_code(tmp_path):
    """Raised inside the compilation, JAX then crashed at exit (SIGSEGV, 139) instead of exiting 143."""
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_AND_STOP], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert result.returncode == 143, result.stderr[-2000:]
    # The signal, sent again every 50 ms, lands after the compilation returns: before the print
    # that follows it, inside it (between its text and its newline), or in the loop after it.
    assert result.stdout.endswith("stopped by SIGTERM\n"), result.stdout
    assert result.stdout.removesuffix("stopped by SIGTERM\n") in ("", "compiled", "compiled\n"), result.stdout


# The runs of test_run_end_signals.py and other files (test_shortened_interim.py among them) take
# these from here.
def _four_step_config(data_dir, final_choice: bool):
    """A tiny run of 4 steps, checkpointed and validated every 2, with or without the final choice."""
    from jaxformer.training.config_file import apply_overrides, load_config

    config = load_config("tiny")
    overrides = {
        "data.data_dir": str(data_dir),
        "training.num_train_steps": "4",
        "training.checkpoint_every_steps": "2",
        "training.eval_every_steps": "2",
        "training.final_choice": str(final_choice),
        "training.average_last": "2",
        "data.max_eval_examples": "8",
        "decoding.beam_size": "2",
        "decoding.max_extra_length": "4",
        "model.num_encoder_layers": "1",
        "model.num_decoder_layers": "1",
        "data.batch_size": "8",  # a row for each of the 8 simulated devices (tests/conftest.py)
        "data.eval_batch_size": "8",
    }
    apply_overrides(config, list(overrides.items()))
    return config


def _time_budget_spent_at_step_1(config) -> None:
    """A time budget that any first step spends: checked after each step (tiny logs every step),
    it ends the run at step 1, where that step's evaluation and checkpoint are due."""
    config.training.time_budget_minutes = 1e-9


def _signal_after_step(loop, signalled: int | None = None):
    """loop.run_due, then SIGTERM once the work of step `signalled` (None: the last step) is done,
    as if it came during that step's evaluation or checkpoint."""
    real_run_due = loop.run_due

    def signal_after_the_step(periodic, step, end, *timing):
        real_run_due(periodic, step, end, *timing)
        if step == (end if signalled is None else signalled):
            os.kill(os.getpid(), signal.SIGTERM)

    return signal_after_the_step


def test_a_signal_held_in_jax_while_a_run_prepares_stops_it_before_its_first_step(data_dir, tmp_path, monkeypatch):
    """One that came inside JAX's code late in the preparation (the state's compilation) is not
    handed to the training loop, which would compile and take a step first: the run stops before."""
    from jaxformer.training import loop, run_start, signals
    from jaxformer.training.config_file import apply_overrides, load_config

    config = load_config("tiny")
    apply_overrides(config, [("data.data_dir", str(data_dir)), ("data.batch_size", "8"), ("data.eval_batch_size", "8")])
    workdir = tmp_path / "run"
    real_shapes = run_start.state_shapes_and_shardings

    def signal_inside_jax(*args, **kwargs):
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, _frame_of("jax._src.interpreters.pxla"))  # held
        return real_shapes(*args, **kwargs)

    monkeypatch.setattr(run_start, "state_shapes_and_shardings", signal_inside_jax)
    monkeypatch.setattr(signals, "_RETRY_SECONDS", 600.0)  # still held when the loop would take over
    assert loop.train_and_evaluate(config, workdir) == {"stopped_by_signal": signal.SIGTERM}
    assert not workdir.exists()  # no step, no checkpoint: the start undone
