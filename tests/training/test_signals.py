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
