"""A SIGTERM or Ctrl-C that comes while a callback of an object's end runs (a weakref's, a
`__del__`, often inside a garbage collection), under RaiseOnSignal: Python prints an exception
raised there ('Exception ignored in') and drops it, so the signal is held and raised after."""

import os
import signal
import time
import types
import weakref

import pytest

from jaxformer.training.signals import RaiseOnSignal, Stopped
from tests.training.test_signals import _frame_of


def _wait_for_the_stop(signals):
    """Ordinary code after the callback: the held signal, sent again, is raised here."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise AssertionError(f"the signal was never raised (held: {signals.signum})")


class _Plain:
    pass


class _Ending:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__
        sum(range(1000))


def _signal_in_a_weakref_callback(ref):  # not known as a callback by its module: Python drops its Stopped
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(1000))


@pytest.mark.parametrize("where", ["weakref callback", "__del__", "weakref.py's frame"])
def test_a_signal_in_a_callback_of_an_objects_end_is_raised_once_it_returns(capfd, where):
    """Python prints an exception raised in a weakref callback or a __del__ ('Exception ignored
    in') and drops it; the sweep's pace measurement then ran to its end. The signal is held and
    sent again, and raised in the ordinary code after the callback, without the print."""
    with pytest.raises(Stopped) as stopped, RaiseOnSignal() as signals:
        if where == "weakref callback":
            ended = _Plain()
            reference = weakref.ref(ended, _signal_in_a_weakref_callback)
            del ended  # the callback runs here, and the handler inside it
            assert reference() is None
        elif where == "__del__":
            ended = _Ending()
            del ended
        else:  # the frame of WeakValueDictionary's `remove`, as the audit's traceback showed
            try:
                signals._handle(signal.SIGTERM, _frame_of("weakref"))
            except Stopped:
                raise AssertionError("raised inside weakref.py") from None
        assert signals.signum == signal.SIGTERM  # held, not lost
        _wait_for_the_stop(signals)
    assert stopped.value.signum == signal.SIGTERM
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_signal_in_a_del_method_is_held_by_its_frame():
    frame = types.SimpleNamespace(
        f_globals={"__name__": "somewhere"}, f_code=types.SimpleNamespace(co_name="__del__"), f_back=None
    )
    with pytest.raises(Stopped), RaiseOnSignal() as signals:
        try:
            signals._handle(signal.SIGTERM, frame)
        except Stopped:
            raise AssertionError("raised inside __del__") from None
        signals.check()
