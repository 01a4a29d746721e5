"""The barrier of orbax's asynchronous saves with several processes (jaxformer/run/save_barrier.py),
on a key-value store faked in memory: a process whose writes failed tells the others, which stop
waiting, instead of every process waiting at a barrier another never reaches."""

import threading
import time

import numpy as np
import pytest
from orbax.checkpoint._src.multihost import multihost as orbax_multihost

from jaxformer.errors import UserError
from jaxformer.run import save_barrier
from jaxformer.run.save_barrier import (
    SaveBarrier,
    SaveFailedElsewhereError,
    failure_seen,
    raise_failed_save,
    start_save,
    wait_for_save,
)


class Store:
    """jax's DistributedRuntimeClient's key-value calls that the barrier makes, in memory."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def key_value_increment(self, key, amount):
        with self.changed:
            self.values[key] = str(int(self.values.get(key, "0")) + amount)
            self.changed.notify_all()
            return int(self.values[key])

    def key_value_try_get(self, key):
        with self.changed:
            if key not in self.values:
                raise RuntimeError(f"NOT_FOUND: {key}")
            return self.values[key]

    def key_value_set(self, key, value):
        with self.changed:
            if key in self.values:
                raise RuntimeError(f"ALREADY_EXISTS: {key}")
            self.values[key] = value
            self.changed.notify_all()

    def key_value_delete(self, key):
        with self.changed:
            self.values.pop(key, None)


def barriers(store, count=2):
    return [SaveBarrier("/run/checkpoints", "saves/1", store, index, count) for index in range(count)]


def in_thread(work):
    """`work()` in a thread of its own (orbax's background threads), its outcome once it ends."""
    outcome = {}

    def run():
        try:
            outcome["returned"] = work()
        except BaseException as error:  # noqa: BLE001
            outcome["raised"] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_every_process_passes_once_all_arrive_and_the_same_key_waits_again():
    store = Store()
    first, second = barriers(store)
    for _ in range(2):  # orbax waits at the same key at every save
        thread, outcome = in_thread(lambda: first(key="set_value_start", timeout_ms=5000))
        time.sleep(0.2)
        assert thread.is_alive()  # waits for process 1
        second(key="set_value_start", timeout_ms=5000)
        thread.join(5)
        assert outcome == {"returned": None}
    assert "saves/1/set_value_start/0" not in store.values  # the first save's, left by every process


# The barriers one process of a two-process run waited at in each of its parameter saves (orbax's
# keys; the step's folder name ends two of them).
def orbax_save_keys(step):
    holder = ("ThreadSaveMultiHostValueHolder:set_value_start", "ThreadSaveMultiHostValueHolder:set_value_end")
    return (*holder, f"_async_write_complete.{step}", f"_async_commit_complete.{step}", *holder)


def test_no_counter_is_left_in_the_store_once_every_process_has_left_it():
    """Five saves of a two-process run left 12 entries in jax's store: two a save (the barriers named
    after its step, each waited at once), and the last of each repeated one."""
    store = Store()
    first, second = barriers(store)

    def save(barrier, step):
        for key in orbax_save_keys(step):
            barrier(key=key, timeout_ms=5000)

    for step in range(1, 21):
        thread, outcome = in_thread(lambda step=step: save(second, step))
        save(first, step)
        thread.join(5)
        assert outcome == {"returned": None}
    assert store.values == {}


class SlowToLook:
    """One process's view of the store: its looks at a barrier's counter held until `go` is set."""

    def __init__(self, store):
        self.store, self.go = store, threading.Event()

    def key_value_try_get(self, key):
        if not key.endswith("/failed"):
            self.go.wait(5)
        return self.store.key_value_try_get(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_counter_stays_until_the_process_slowest_to_look_has_left_it():
    """Process 1 arrived first, then process 0, which left at once: process 1, not yet looking
    again, must find the counter (a missing key is an error in jax's store), then deletes it."""
    store = Store()
    slow = SlowToLook(store)
    first = SaveBarrier("/run/checkpoints", "saves/1", store, 0, 2)
    second = SaveBarrier("/run/checkpoints", "saves/1", slow, 1, 2)
    thread, outcome = in_thread(lambda: second(key="_async_write_complete.10", timeout_ms=5000))
    time.sleep(0.2)
    first(key="_async_write_complete.10", timeout_ms=5000)
    counter = "saves/1/_async_write_complete.10/0"
    assert store.values == {counter: "3", f"{counter}:verdict": "passed"}  # both arrived, one left; the last's verdict
    slow.go.set()
    thread.join(5)
    assert outcome == {"returned": None} and store.values == {}


def test_a_process_whose_writes_failed_stops_the_others_waiting_with_its_error():
    """Process 1's writes failed: orbax's finalize thread goes from the failed save to a barrier that
    process 0, waiting where the writes end, never reaches. Both return within a poll."""
    store = Store()
    first, second = barriers(store)
    first.step = second.step = 10
    waiting, told = in_thread(lambda: first(key="async_write_complete.10", timeout_ms=60_000))

    def finalize_after_failed_writes():
        try:
            raise ValueError("OUT_OF_RANGE: Error writing ocdbt.process_1/d/6e13: File too large")
        finally:
            second(key="set_value_start", timeout_ms=60_000)

    time.sleep(0.2)
    finalizing, failed = in_thread(finalize_after_failed_writes)
    waiting.join(5)
    finalizing.join(5)
    assert "File too large" in str(failed["raised"])  # its own error, not the barrier's
    assert isinstance(told["raised"], SaveFailedElsewhereError)
    assert str(told["raised"]) == (
        "process 1 of the run failed to save checkpoint 10 in /run/checkpoints: ValueError: OUT_OF_RANGE: "
        "Error writing ocdbt.process_1/d/6e13: File too large"
    )
    # Process 0's own finalize then: its barrier's error in flight, no wait; a later barrier raises at once.
    with pytest.raises(SaveFailedElsewhereError):
        first(key="set_value_start", timeout_ms=60_000)


def test_an_error_the_main_thread_handles_is_no_failed_save():
    """A save started while the main thread handles an error (unreadable data: an interim checkpoint)
    waits for the others as any save."""
    store = Store()
    first, second = barriers(store)
    thread, outcome = in_thread(lambda: second(key="set_value_start", timeout_ms=5000))
    try:
        raise OSError("a damaged batch")
    except OSError:
        first(key="set_value_start", timeout_ms=5000)
    thread.join(5)
    assert outcome == {"returned": None}
    assert "saves/1/failed" not in store.values


def test_a_barrier_another_process_never_reaches_times_out_as_orbax_asked():
    (first, _) = barriers(Store())
    with pytest.raises(TimeoutError, match="every process at async_write_complete.10"):
        first(key="async_write_complete.10", timeout_ms=200)


def test_a_failed_save_is_raised_in_every_process_at_the_next_exchange():
    """Process 0's view: process 1 told its failure; the exchange every 10 steps (step_exchange.py,
    which gathers each process's `failure_seen`) ends the run in both (each waiting for its save,
    which raises), not the next checkpoint, maybe hours later."""
    store = Store()
    first, second = barriers(store)
    second.step = 80
    waits = []
    assert not failure_seen(first)
    raise_failed_save(first, lambda: pytest.fail("waited with no save failed"), np.array([0, 0]))
    second.tell(OSError(27, "File too large"))
    assert failure_seen(first) and failure_seen(second)
    with pytest.raises(SaveFailedElsewhereError, match="^process 1 of the run failed to save checkpoint 80 in "):
        raise_failed_save(first, lambda: waits.append("waited"), np.array([1, 0]))  # a wait that raised nothing
    assert waits == ["waited"]
    assert not failure_seen(None)  # one process: no barrier


class SavingManager:
    """orbax's CheckpointManager as start_save calls it: its save waits at two of orbax's barriers
    across every process (a collective of every device, faked to fail the test if reached), the
    second in a thread of orbax's, as its step folder's creation does, the main one waiting for it;
    `fails` (an error) raised before them."""

    def __init__(self, fails=None):
        self.fails = fails

    def wait_until_finished(self):
        pass

    def save(self, step, args, force):
        if self.fails is not None:
            raise self.fails
        orbax_multihost.sync_global_processes("CheckpointManager:save_start")
        thread, outcome = in_thread(lambda: orbax_multihost.sync_global_processes("create_tmp_directory:post"))
        thread.join(10)
        if "raised" in outcome:
            raise outcome["raised"]


def test_orbax_barriers_of_a_save_end_when_another_process_failed_its_part(monkeypatch):
    """The save's synchronous part waits at orbax's own barriers: process 1 failed there (its data
    position not written on a full disk) and process 0 waited in a collective for ever, until jax's
    shutdown aborted both. Process 0's view, process 1's barrier called as its start_save would."""
    monkeypatch.setattr(orbax_multihost, "sync_global_processes", lambda *args, **kwargs: pytest.fail("a collective"))
    store = Store()
    first, second = barriers(store)
    waiting, outcome = in_thread(lambda: start_save(SavingManager(), first, 20, None))
    for name in ("CheckpointManager:save_start", "create_tmp_directory:post"):
        time.sleep(0.1)
        assert waiting.is_alive()  # for process 1
        second(key=f"synchronous/{name}", timeout_ms=5000)
    waiting.join(5)
    assert outcome == {"returned": None} and store.values == {}
    waiting, told = in_thread(lambda: start_save(SavingManager(), first, 40, None))
    second(key="synchronous/CheckpointManager:save_start", timeout_ms=5000)
    time.sleep(0.2)
    assert waiting.is_alive()  # at create_tmp_directory:post, which process 1 never reaches
    full = OSError(28, "No space left on device")
    with pytest.raises(OSError) as raised:
        start_save(SavingManager(fails=full), second, 40, None)  # process 1's: tells its error
    waiting.join(5)
    assert raised.value is full and isinstance(told["raised"], SaveFailedElsewhereError)
    assert str(told["raised"]) == (
        "process 1 of the run failed to save checkpoint 40 in /run/checkpoints: OSError: [Errno 28] No space left on "
        "device"
    )
    with pytest.raises(pytest.fail.Exception, match="a collective"):  # orbax's own once the saves started
        orbax_multihost.sync_global_processes("CheckpointManager:delete")


def test_a_save_this_process_cannot_start_is_one_line_and_the_others_are_told_its_os_error():
    """Process 0's step folder refused in the save's synchronous part (a read-only checkpoints
    folder): a traceback in process 0 before, now one line naming the save, as the others quote it.
    A full disk or a file-size limit stays the OSError that the command's own line names."""
    store = Store()
    first, second = barriers(store)
    refused = PermissionError(13, "Permission denied", "/run/checkpoints/20.orbax-checkpoint-tmp")
    with pytest.raises(UserError) as raised:
        start_save(SavingManager(fails=refused), first, 20, None)
    error = "PermissionError: [Errno 13] Permission denied: '/run/checkpoints/20.orbax-checkpoint-tmp'"
    assert str(raised.value) == f"cannot save checkpoint 20 in /run/checkpoints: {error}"
    assert raised.value.__cause__ is refused
    assert second.told() == f"process 0 of the run failed to save checkpoint 20 in /run/checkpoints: {error}"
    for limit in (OSError(28, "No space left on device"), OSError(27, "File too large")):
        with pytest.raises(OSError) as raised:
            start_save(SavingManager(fails=limit), barriers(Store())[0], 20, None)
        assert raised.value is limit


def test_a_failure_told_once_every_process_arrived_lets_each_pass(monkeypatch):
    """Process 1 waited at a barrier of the save's synchronous part; process 0 arrived last and
    passed, then its writes failed and it told them. Process 1 raised that failure at its next look,
    and process 0, gone on to the training loop's exchange (a collective), waited there for ever. Both
    pass now (every process raises the failure at that exchange), or both raise where process 0 had
    not arrived."""
    monkeypatch.setattr(save_barrier, "_POLL_SECONDS", 0.5)  # process 1 looks after process 0 has told
    first, second = barriers(Store())
    first.step = second.step = 40
    waiting, outcome = in_thread(lambda: second(key="synchronous/save_finalize", timeout_ms=60_000))
    time.sleep(0.1)
    first(key="synchronous/save_finalize", timeout_ms=60_000)
    first.tell(PermissionError(13, "Permission denied", "/run/checkpoints/40.orbax-checkpoint-tmp/metadata"))
    waiting.join(5)
    assert outcome == {"returned": None}
    assert failure_seen(first) and failure_seen(second)
    waiting, outcome = in_thread(lambda: second(key="synchronous/save_finalize", timeout_ms=60_000))
    waiting.join(5)
    assert isinstance(outcome["raised"], SaveFailedElsewhereError)  # taken back: process 0 arriving raises too
    with pytest.raises(SaveFailedElsewhereError):
        first(key="synchronous/save_finalize", timeout_ms=60_000)


class FailedManager:
    """orbax's CheckpointManager whose save under way failed in its background threads."""

    directory = "/run/checkpoints"

    def __init__(self, error):
        self.error = error

    def wait_until_finished(self):
        raise self.error


def test_a_save_whose_writes_failed_in_this_process_is_one_line_where_it_is_waited_for():
    """Process 0's writes refused (a file of the step it may not write, a step folder it may not
    rename): orbax raises that error where the save is next waited for, a traceback in process 0
    (exit 1) before; now one line naming the save, as the others quote it."""
    store = Store()
    first, second = barriers(store)
    first.step = 40
    refused = PermissionError(13, "Permission denied", "/run/checkpoints/40.orbax-checkpoint-tmp")
    with pytest.raises(UserError) as raised:
        wait_for_save(FailedManager(refused), first, 40)
    error = "PermissionError: [Errno 13] Permission denied: '/run/checkpoints/40.orbax-checkpoint-tmp'"
    assert str(raised.value) == f"cannot save checkpoint 40 in /run/checkpoints: {error}"
    assert raised.value.__cause__ is refused
    assert second.told() == f"process 0 of the run failed to save checkpoint 40 in /run/checkpoints: {error}"
    try:  # orbax's finalize thread: its barrier, called while it handles the error, raises it as told
        try:
            raise refused
        except PermissionError:
            raise SaveFailedElsewhereError(second.told())  # noqa: B904  (as orbax: the context kept)
    except SaveFailedElsewhereError as told:
        with pytest.raises(UserError) as raised:
            wait_for_save(FailedManager(told), first, 40)
    assert str(raised.value) == f"cannot save checkpoint 40 in /run/checkpoints: {error}"
    # orbax's other thread, which raised at its barrier with no error in hand: the error told, this process's
    with pytest.raises(UserError) as raised:
        wait_for_save(FailedManager(SaveFailedElsewhereError(first.told())), first, 40)
    assert str(raised.value) == f"cannot save checkpoint 40 in /run/checkpoints: {error}"
    # Its array files refused, as tensorstore raises it: a traceback in this process too.
    text = "PERMISSION_DENIED: Error writing local file \"ocdbt.process_0/d/1\": Permission denied [os_error_code='13']"
    with pytest.raises(UserError) as raised:
        wait_for_save(FailedManager(ValueError(text)), first, 40)
    assert str(raised.value) == f"cannot save checkpoint 40 in /run/checkpoints: ValueError: {text}"
    with pytest.raises(SaveFailedElsewhereError):  # the other process's, quoted: its own line
        wait_for_save(
            FailedManager(SaveFailedElsewhereError(f"process 1 ...: ValueError: {text}")), barriers(Store())[0], 40
        )
    full = ValueError("RESOURCE_EXHAUSTED: Error writing local file: No space left on device [os_error_code='28']")
    for limit in (OSError(28, "No space left on device"), OSError(27, "File too large"), full):
        with pytest.raises(Exception) as raised:  # noqa: PT011  (whichever the limit is)
            wait_for_save(FailedManager(limit), None, 40)
        assert raised.value is limit
