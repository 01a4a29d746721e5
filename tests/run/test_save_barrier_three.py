"""The save barrier (jaxformer/run/save_barrier.py) with three processes, on the key-value store
faked in memory: a failure told while they wait at one barrier passes it in every process or in
none, whichever order their withdrawals take; real processes: tests/training/test_failed_save_three_processes.py."""

import threading

import pytest

from jaxformer.run.save_barrier import SaveBarrier, SaveFailedElsewhereError
from tests.run.test_save_barrier import Store, in_thread

KEY = "synchronous/CheckpointManager:old_steps_to_remove"  # the last barrier of a save's main thread
COUNTER = f"saves/1/{KEY}/0"
DENIED = PermissionError(13, "Permission denied", "/run/checkpoints/40.orbax-checkpoint-tmp/state")


class Ordered:
    """One process's view of the store, its barrier's steps held in the order a test forces: its
    first look for a failure waits until one is told (`looks_once_told`); an arrival, a leaving or a
    withdrawal (an increment of `amount` other than 1) waits for `before[step]` (an Event, which
    may never come: 5 s at most; `held` is set meanwhile), then sets `after[step]`."""

    def __init__(self, store, looks_once_told=False, before=None, after=None):
        self.store, self.looks_once_told = store, looks_once_told
        self.before, self.after, self.increments = before or {}, after or {}, 0
        self.held = threading.Event()

    def key_value_increment(self, key, amount):
        step = "withdraw" if amount != 1 else ("arrive" if self.increments == 0 else "leave")
        self.increments += amount == 1
        if step in self.before:
            self.held.set()
            self.before[step].wait(5)
        value = self.store.key_value_increment(key, amount)
        if step in self.after:
            self.after[step].set()
        return value

    def key_value_try_get(self, key):
        if key.endswith("/failed") and self.looks_once_told and self.increments:
            self.looks_once_told = False
            with self.store.changed:
                self.store.changed.wait_for(lambda: key in self.store.values, timeout=5)
        return self.store.key_value_try_get(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


def barrier(client, index):
    made = SaveBarrier("/run/checkpoints", "saves/1", client, index, 3)
    made.step = 40
    return made


def test_three_processes_pass_a_barrier_once_all_arrive_and_leave_no_counter():
    store = Store()
    waiting = [in_thread(lambda index=index: barrier(store, index)(key=KEY, timeout_ms=5000)) for index in (1, 2)]
    barrier(store, 0)(key=KEY, timeout_ms=5000)
    for thread, outcome in waiting:
        thread.join(5)
        assert outcome == {"returned": None}
    assert store.values == {}


def test_a_failure_told_once_all_three_arrived_passes_every_process_whatever_the_withdrawals_order():
    """Process 0 arrived last and passed; before it left, process 1's writes failed and it told the
    others. Processes 1 and 2 withdrew, 2's while 1's was in flight: 2 read the count lowered by 1's
    withdrawal, took itself for early and raised, while 0 went on to the training loop's exchange,
    where 2 never came (every process waited there until killed, 300 s). Now all three pass, and
    meet the failure at their next barrier (or the exchange), together."""
    store = Store()
    first_withdrew, second_withdrew, all_arrived = threading.Event(), threading.Event(), threading.Event()
    held = {"leave": second_withdrew}  # its withdrawal, taken back, in flight until process 2's
    one = barrier(Ordered(store, looks_once_told=True, before=held, after={"withdraw": first_withdrew}), 1)
    one_waits = in_thread(lambda: one(key=KEY, timeout_ms=60_000))
    two = barrier(
        Ordered(store, looks_once_told=True, before={"withdraw": first_withdrew}, after={"withdraw": second_withdrew}),
        2,
    )
    two_waits = in_thread(lambda: two(key=KEY, timeout_ms=60_000))
    with store.changed:
        assert store.changed.wait_for(lambda: store.values.get(COUNTER) == "2", timeout=5)
    zero = barrier(Ordered(store, after={"arrive": all_arrived}, before={"leave": second_withdrew}), 0)
    zero_passes = in_thread(lambda: zero(key=KEY, timeout_ms=60_000))
    assert all_arrived.wait(5)
    one.tell(DENIED)  # its writes, in a thread of its own
    outcomes = []
    for thread, outcome in (zero_passes, one_waits, two_waits):
        thread.join(10)
        outcomes.append(outcome)
    assert outcomes == [{"returned": None}] * 3
    for each in (zero, one, two):
        with pytest.raises(SaveFailedElsewhereError, match="^process 1 of the run failed to save checkpoint 40 in "):
            each(key="_async_write_complete.40", timeout_ms=60_000)
    assert sorted(store.values) == ["saves/1/failed"]  # the barrier's counter and verdict, left by all three


def test_a_process_arriving_after_a_withdrawal_fails_the_barrier_with_the_others():
    """Process 0 looked for a failure before process 1 told one, then arrived after process 2 had
    withdrawn (every process counted, one withdrawal among them): all three raise the failure."""
    store = Store()
    withdrew = threading.Event()
    one = barrier(Ordered(store), 1)
    one_waits = in_thread(lambda: one(key=KEY, timeout_ms=60_000))
    two = barrier(Ordered(store, after={"withdraw": withdrew}), 2)
    two_waits = in_thread(lambda: two(key=KEY, timeout_ms=60_000))
    with store.changed:
        assert store.changed.wait_for(lambda: store.values.get(COUNTER) == "2", timeout=5)
    late = threading.Event()
    zero_client = Ordered(store, before={"arrive": late})
    zero = barrier(zero_client, 0)
    zero_arrives = in_thread(lambda: zero(key=KEY, timeout_ms=60_000))
    assert zero_client.held.wait(5)  # it has looked for a failure: none yet
    one.tell(DENIED)
    assert withdrew.wait(5)
    late.set()
    for thread, outcome in (zero_arrives, one_waits, two_waits):
        thread.join(10)
        assert isinstance(outcome.get("raised"), SaveFailedElsewhereError), outcome


class DiesBeforeItsVerdict(Ordered):
    """A process killed (kill -9) as it withdraws first, before it writes its verdict: its write never
    comes (held until `revived` is set, the test done)."""

    def __init__(self, store, **ordered):
        super().__init__(store, **ordered)
        self.revived = threading.Event()

    def key_value_set(self, key, value):
        if key.endswith(":verdict"):
            self.revived.wait(30)
            raise RuntimeError("killed")
        return self.store.key_value_set(key, value)


def test_the_verdict_of_a_process_killed_as_it_withdrew_first_comes_from_the_last_to_arrive():
    """Process 2 arrived last and passed; then a failure was told, and process 1 withdrew first (so
    the barrier passed) and died before it wrote its verdict. Process 0, withdrawing next, waited for
    that verdict until the barrier's timeout (every process aborted by jax's heartbeat first); it
    passes now, as process 2 did, with the verdict process 2 wrote as the last to arrive."""
    store = Store()
    first_withdrew = threading.Event()
    dying = DiesBeforeItsVerdict(store, looks_once_told=True, after={"withdraw": first_withdrew})
    one = barrier(dying, 1)
    one_dies = in_thread(lambda: one(key=KEY, timeout_ms=60_000))
    zero = barrier(Ordered(store, looks_once_told=True, before={"withdraw": first_withdrew}), 0)
    zero_waits = in_thread(lambda: zero(key=KEY, timeout_ms=60_000))
    with store.changed:
        assert store.changed.wait_for(lambda: store.values.get(COUNTER) == "2", timeout=5)
    barrier(store, 2)(key=KEY, timeout_ms=60_000)  # the last to arrive: passes at once
    one.tell(DENIED)
    try:
        zero_waits[0].join(10)
        assert zero_waits[1] == {"returned": None} and one_dies[0].is_alive()  # process 1 "dead" at its verdict
        assert store.values[f"{COUNTER}:verdict"] == "passed"
    finally:
        dying.revived.set()
        one_dies[0].join(5)
