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
