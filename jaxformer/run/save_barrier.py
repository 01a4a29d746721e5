"""The barrier at which the processes of a multi-process run wait for each other's part of an
asynchronous checkpoint save (orbax's AsyncOptions.barrier_sync_fn), told when that part failed
in any one of them.

Each process writes its own shards in orbax's background thread, then waits for the others at a
barrier ("async_write_complete"). A process whose writes failed (a file-size limit or a full disk
on its host, a file it may not write) skips that barrier: orbax's finalize thread, in the `finally`
of the failed save, goes on to the next one ("set_value_start"). With jax's barriers every process
then waited at a barrier the others never reached, for orbax's 20-minute timeout, without a word.
Here a process that reaches a barrier with its save's error in flight posts that error in jax's
key-value store and waits no more; a process waiting at any barrier of the same saves raises
SaveFailedElsewhereError quoting it within a poll, and so does every later barrier of theirs.
The main threads learn of it where they next wait for the save, or sooner where every process
asks (`raise_failed_save`: the training loop, every 10 steps), so that all stop at one point.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import multihost
from orbax.checkpoint._src.multihost import multihost as orbax_multihost  # where orbax's modules look it up

from jaxformer.errors import UserError, file_size_limit_error, first_line, no_space_error

_POLL_SECONDS = 0.05  # between a waiting process's looks at the arrivals and for a failure
# A withdrawal's increment of a barrier's counter, above its arrivals and leavings (two a process) for
# up to 16383 processes, their sum within jax's 32-bit counters.
_WITHDRAWAL = 1 << 16
_MESSAGE_CHARACTERS = 2000  # of the failed process's error, passed on whole up to this length
_SYNCHRONOUS_TIMEOUT_MS = 24 * 3600 * 1000  # orbax's collective waited for ever; a failure told ends the wait
# Barriers made in this process, by folder: every process makes a folder's checkpointers in the same order.
_made: dict[str, int] = {}


class SaveFailedElsewhereError(UserError):
    """Another process of the run failed to write its part of a checkpoint."""


class SaveFailedError(UserError):
    """This process failed to start its part of a checkpoint (an OSError: its step folder refused)."""


def save_barrier(directory: str, parent: SaveBarrier | None = None) -> SaveBarrier | None:
    """A new SaveBarrier for the saves into `directory` with several processes, else None (orbax
    waits for nobody); one that hears a failure told at `parent`'s too (a save of its own that the
    parent's checkpointer makes: a process may fail in the parent's part of it)."""
    if not (jax.distributed.is_initialized() and jax.process_count() > 1):
        return None
    _made[directory] = _made.get(directory, 0) + 1
    namespace = f"jaxformer/saves/{directory}/{_made[directory]}"
    client = multihost.get_jax_distributed_client()
    made = SaveBarrier(directory, namespace, client, jax.process_index(), jax.process_count())
    made.heard += () if parent is None else parent.heard
    return made


def start_save(manager: ocp.CheckpointManager, barrier: SaveBarrier | None, step: int, args) -> None:
    """`manager.save(step, args)`, its writes left to orbax's background thread; an error raised in
    this process before them is told to the others, which would wait for this one's writes.

    The save's synchronous part waits for every process at barriers of its own (its start, the
    step's temporary folder made, the old steps to remove listed), which orbax makes collectives
    of every device: a process whose part failed there (its data position not written on a full
    disk) stopped, and the others waited in one for ever, until jax's shutdown barrier aborted all
    of them 5 minutes later, the others without a word. With several processes they wait at
    `barrier` instead, which a failure told ends (`barriers_through`). An OSError of this process's
    own (its step folder refused: a read-only checkpoints folder) ends it in one line, as the others
    quote it; a full disk or a file-size limit keeps the command's own line and exit code."""
    if barrier is None:
        try:
            manager.save(step, args=args, force=True)
        except OSError as error:
            raise_own_save_error(error, step, manager.directory)
        return
    wait_for_save(manager, barrier, barrier.step)  # the save before: none of its threads waits at a barrier now
    barrier.step = step
    try:
        with barriers_through(barrier):
            manager.save(step, args=args, force=True)
    except Exception as error:
        _tell_others(barrier, error)
        if isinstance(error, OSError):
            raise_own_save_error(error, step, barrier.directory)
        raise


def wait_for_save(
    manager: ocp.CheckpointManager,
    barrier: SaveBarrier | None,
    step: int | None,
    wait: Callable[[], None] | None = None,
) -> None:
    """`manager.wait_until_finished()` (or `wait`: its close): returns once its save under way (of
    `step`) is written. An error of its writes, which orbax's background threads kept, is raised here
    and, with several processes, told to the others; an OSError of this process's own (a file of the
    step refused: a permission, a read-only file system) in one line, as the others quote it, where
    it was a traceback (exit 1), or the others' line quoting this process; a full disk or a
    file-size limit as it is."""
    try:
        (wait or manager.wait_until_finished)()
    except Exception as error:
        _cancel_leftover_writes()
        if barrier is not None:
            _tell_others(barrier, error)
        own = _os_error_in_chain(error)  # orbax's threads went on to a barrier, which raised it as told
        if own is None and barrier is not None and isinstance(error, SaveFailedElsewhereError):
            own = _os_error_in_chain(barrier.own_failure)  # told by this process
        if own is not None and step is not None:
            raise_own_save_error(own, step, manager.directory)
        raise


def _cancel_leftover_writes() -> None:
    """Cancels orbax's background threads still running once a save failed: the writes of its
    other items, waiting for their files or for the other processes' signals. Each logged its own
    end after the command's one-line error (its file refused, or an executor shut down as the
    process ended: "cannot schedule new futures after shutdown"); cancelled, it ends without a
    word. Only the run's checkpoints are saved asynchronously, one save at a time (the others wait
    for theirs), so the threads running are the failed save's."""
    # A private orbax class (orbax-checkpoint 0.12): where a later orbax moves or renames it, the
    # failure is still reported in one line and only the leftover lines come back, so its absence
    # must never turn that failure into a traceback here.
    try:
        from orbax.checkpoint._src.futures import future as orbax_future

        signaling_thread = orbax_future._SignalingThread
    except (ImportError, AttributeError):
        return
    for thread in threading.enumerate():
        if isinstance(thread, signaling_thread) and thread.is_alive():
            thread.cancel()


def _os_error_in_chain(error: BaseException | None) -> BaseException | None:
    """The OSError that `error` is, or was raised while handling, else None; or tensorstore's error
    that names one (an array file refused: ValueError "PERMISSION_DENIED: ... [os_error_code='13']")."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        if "[os_error_code=" in str(error) and not isinstance(error, SaveFailedElsewhereError):  # not another's
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def save_errors(step: int, directory) -> Iterator[None]:
    """An OSError of this process's own in a save's step made ready for it (process 0's rename of
    what the step's name held, refused: a read-only checkpoints folder) as one line, as the others
    quote it (on_process_0), where it was a traceback (exit 1); a full disk or a file-size limit as it is."""
    try:
        yield
    except OSError as error:
        raise_own_save_error(error, step, directory)


def raise_own_save_error(error: BaseException, step: int, directory) -> NoReturn:
    """`error`, raised by this process's save of `step`, raised as one line (SaveFailedError); a full
    disk or a file-size limit as it is, for the command's own line and exit code."""
    if no_space_error(error) is not None or file_size_limit_error(error) is not None:
        raise error
    raise SaveFailedError(f"cannot save checkpoint {step} in {directory}: {first_line(error)}") from error


def _tell_others(barrier: SaveBarrier, error: Exception, step: int | None = None) -> None:
    """`error`, raised in this process, told to the others; one another process told is theirs already."""
    if not isinstance(error, SaveFailedElsewhereError):
        barrier.tell(error, step)


@contextlib.contextmanager
def told_to_others(barrier: SaveBarrier | None, step: int | None, directory) -> Iterator[None]:
    """An error of this process's main thread in the save of `step` (its wait for the save before,
    a listing of the steps), told to the others, which raise it at their next barrier of the run's
    checkpoints (`barriers_through`); an OSError of its own in one line. Raised past the save's last
    barrier (in process 1 alone, as the next save began), it ended that process alone, and the others
    waited for it in their next collective of the checkpoints (a step's metadata read) until jax's
    shutdown barrier aborted every process 5 minutes later (exit -6, no `error:` line): no barrier of
    that save was left to tell."""
    try:
        yield
    except Exception as error:
        if barrier is not None and not isinstance(error, SaveFailedError):  # that one told already
            _tell_others(barrier, error, step)
        if isinstance(error, OSError) and step is not None:
            raise_own_save_error(error, step, directory)
        raise


@contextlib.contextmanager
def barriers_through(barrier: SaveBarrier | None) -> Iterator[None]:
    """orbax's barriers across every process (`sync_global_processes` with no subset: a collective of
    every device, which waits for ever), made by any thread while this process starts a save or reads
    a step between saves, wait at `barrier` instead (with one process, none). The threads of the save
    before are done (no barrier of theirs comes in between) and those of this save's writes wait at
    `barrier` anyway (AsyncOptions), so each process waits at the same barriers in the same order.
    A read's barrier hears a failure told past a save's last barrier (`told_to_others`): the others
    waited for that process in the read's collective (the interim steps looked for at the next save)."""
    if barrier is None:
        yield
        return
    collective = orbax_multihost.sync_global_processes

    def sync_global_processes(name: str, *, processes=None, **kwargs) -> None:
        if processes is not None:
            collective(name, processes=processes, **kwargs)
            return
        barrier(key=f"synchronous/{name}", timeout_ms=_SYNCHRONOUS_TIMEOUT_MS)

    orbax_multihost.sync_global_processes = sync_global_processes
    try:
        yield
    finally:
        orbax_multihost.sync_global_processes = collective


def failure_seen(barrier: SaveBarrier | None) -> bool:
    """Whether this process knows yet that a save under way failed in some process (one told it)."""
    return barrier is not None and barrier.told() is not None


def raise_failed_save(barrier: SaveBarrier | None, wait: Callable[[], None], seen: np.ndarray) -> None:
    """Every process at the same point, `seen` every process's `failure_seen` gathered there (the
    training loop's exchange every 10 steps: step_exchange.py): when a save under way has failed in
    any process, `wait()` for it in every one, which raises its error there and
    SaveFailedElsewhereError in the others, instead of training on until the run next waits for
    that save. A process that knew alone would stop alone, and the others wait for it for ever."""
    if np.asarray(seen).any():
        wait()
        told = None if barrier is None else barrier.told()
        raise SaveFailedElsewhereError(told or "another process of the run failed to save a checkpoint")


def _check(deadline: float, key: str, timeout_ms: int | None) -> None:
    """TimeoutError once `deadline` has passed, waiting at barrier `key`."""
    if time.monotonic() > deadline:
        waited = "" if timeout_ms is None else f" after {timeout_ms / 1000:g} s"
        raise TimeoutError(f"timed out{waited} waiting for every process at {key}")


class SaveBarrier:
    """orbax's BarrierSyncFn for one checkpoint manager: `barrier(key=..., timeout_ms=...)`. Every
    process (`index` of `count`) arrives by incrementing a counter under `namespace` in jax's
    key-value store (`client`) and waits until it counts them all, listening meanwhile for a
    process's failure (`tell`); it leaves by incrementing the counter again, and the last to leave
    deletes it. A failure told leaves its counters and the `failed` key behind: the run ends.

    A process told a failure while it waits withdraws (`_withdraw`), and the barrier passes in every
    process or in none, for any number of processes: the store applies each counter's increments
    one at a time, and the barrier has passed exactly where the last arrival comes before the first
    withdrawal. Each process decides from a value of the counter that counts both: none withdrawn
    and every process arrived (an arrival or a look) is that order; a withdrawal counted with fewer
    than every process arrived (leavings come only once all have) is the other; every process
    arrived and a withdrawal counted, the first to withdraw says which came first (its verdict), as
    its own increment told it, and so does the last to arrive: either one killed, the other's stands.
    No increment is taken back: a withdrawal was a decrement, undone by a process that found every
    one arrived, and with three processes one withdrawing while another's was in flight read the
    count lowered, raised, and left a process that had passed waiting for it in the training loop's
    exchange (test_failed_save_three_processes.py). Where the barrier passed
    with a failure told, every process meets it at its next barrier, which raises at once, or at the
    exchange, which every process reaches; where it failed, none passed, so none writes on: orbax's
    finalize renames a step's folder only past a barrier that every process's written share reached."""

    def __init__(self, directory: str, namespace: str, client, index: int, count: int):
        self.directory, self.namespace, self.index, self.count = directory, namespace, index, count
        self.step: int | None = None  # the save under way, for the error told to the others
        self.own_failure: BaseException | None = None  # this process's, when the one told
        self._client = client
        self._failed_key = f"{namespace}/failed"
        self.heard = (self._failed_key,)  # where a failure told is looked for: this barrier's, a parent's
        self._calls: dict[str, int] = {}  # orbax's key: how many times this process waited at it
        self._lock = threading.Lock()

    def __call__(self, *, key: str, timeout_ms: int) -> None:
        failure = sys.exc_info()[1]
        # Orbax's background threads call a barrier with an error in flight only in the `finally`
        # of a save whose writes failed here: the others are told instead of waited for.
        if failure is not None and threading.current_thread() is not threading.main_thread():
            if not isinstance(failure, SaveFailedElsewhereError):
                self.tell(failure)
            return
        self._raise_if_told()
        with self._lock:
            calls = self._calls.get(key, 0)
            self._calls[key] = calls + 1
        counter = f"{self.namespace}/{key}/{calls}"
        deadline = time.monotonic() + timeout_ms / 1000
        state = self._client.key_value_increment(counter, 1)
        if state % _WITHDRAWAL == self.count:  # the last to arrive: it knows the verdict, as the first to withdraw
            self._settle(counter, state < _WITHDRAWAL)
        while (passed := self._outcome(counter, state, deadline)) is None:
            time.sleep(_POLL_SECONDS)
            if self.told() is not None:
                passed = self._withdraw(counter, deadline)
                break
            _check(deadline, key, timeout_ms)
            state = int(self._client.key_value_try_get(counter))
        if not passed:
            raise SaveFailedElsewhereError(self.told() or "another process of the run failed to save a checkpoint")
        # Counted past `count`, which a process still looking reads as all arrived: only the last to
        # leave knows that none reads the counter any more. Orbax names two of a save's barriers after
        # its step, each waited at once; kept, they grew jax's store by two entries a save.
        left = self._client.key_value_increment(counter, 1)
        if left % _WITHDRAWAL == 2 * self.count:  # the last arrival's verdict is written: it has left too
            self._client.key_value_delete(counter)
            self._client.key_value_delete(f"{counter}:verdict")

    def _withdraw(self, counter: str, deadline: float) -> bool:
        """Withdraws this process from `counter`'s barrier, a failure told: whether it passes all the
        same. The first process to withdraw decides for every process (`_outcome`): the barrier passes
        where every process had arrived before it (one may have passed already, and gone on to a
        collective of its own: the training loop's exchange, where every process raises the failure),
        else it fails in all. A withdrawal is never taken back, so that no process reads another's in
        flight as the count lowered."""
        before = self._client.key_value_increment(counter, _WITHDRAWAL) - _WITHDRAWAL
        withdrawals, arrivals = divmod(before, _WITHDRAWAL)
        if withdrawals == 0:
            passed = arrivals >= self.count
            self._settle(counter, passed)
            return passed
        return self._outcome(counter, before, deadline)

    def _settle(self, counter: str, passed: bool) -> None:
        """Writes `counter`'s verdict, which two processes know from their own increments: the last to
        arrive (whether a withdrawal came first) and the first to withdraw (whether every process had
        arrived), one never the other. Either one may die before it writes (killed), and those waiting
        for the verdict read the other's; the first to withdraw alone wrote it, and its death left
        them waiting until jax's heartbeat timeout aborted every process (exit -6, no `error:` line)."""
        try:
            self._client.key_value_set(f"{counter}:verdict", "passed" if passed else "failed")
        except Exception:  # noqa: BLE001  (jax's ALREADY_EXISTS: the other one wrote it, the same)
            return

    def _outcome(self, counter: str, state: int, deadline: float) -> bool | None:
        """Whether `counter`'s barrier passed (True) or failed (False), read from its counter's `state`
        (`_WITHDRAWAL` a withdrawal, 1 an arrival or a leaving), None while it is undecided: passed
        once every process has arrived with none withdrawn; failed where one withdrew before every
        process had arrived, which the first to withdraw, knowing, tells its verdict."""
        withdrawals, arrivals = divmod(state, _WITHDRAWAL)
        if withdrawals == 0:
            return True if arrivals >= self.count else None
        if arrivals < self.count:
            return False
        while True:  # every process has arrived, some after the first withdrawal perhaps: its verdict says
            try:
                return self._client.key_value_try_get(f"{counter}:verdict") == "passed"
            except Exception:  # noqa: BLE001  (jax's NOT_FOUND: the first to withdraw is telling it)
                _check(deadline, counter, None)
                time.sleep(_POLL_SECONDS)

    def tell(self, failure: BaseException, step: int | None = None) -> None:
        """Tells the other processes that this one's part of the save (of `step`, else the one under
        way) failed with `failure`: each raises SaveFailedElsewhereError at its barrier. The first
        process to tell is quoted."""
        saving = self.step if step is None else step
        named = "a checkpoint" if saving is None else f"checkpoint {saving}"
        text = f"process {self.index} of the run failed to save {named} in {self.directory}: "
        text += first_line(failure)[:_MESSAGE_CHARACTERS]
        try:
            self._client.key_value_set(self._failed_key, text)
        except Exception:  # noqa: BLE001  (another process told first: its error is the one quoted)
            return
        self.own_failure = failure

    def told(self) -> str | None:
        """The error a process told (`tell`), None while none has."""
        for key in self.heard:
            try:
                return self._client.key_value_try_get(key)
            except Exception:  # noqa: BLE001  (jax's NOT_FOUND: no process failed)
                continue
        return None

    def _raise_if_told(self) -> None:
        told = self.told()
        if told is not None:
            raise SaveFailedElsewhereError(told)
