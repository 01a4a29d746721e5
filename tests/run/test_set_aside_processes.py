"""A checkpoint set aside in a run of two processes (jax.distributed on localhost, CPU devices), as
a damaged one is when the run resumes: process 0 renames it, once, and every process returns only
once it is renamed (each renaming the one folder, all but the first found it gone); when process 0
cannot, every process raises at once, not when jax's distributed timeout ends the others' wait."""

import json
import shutil
import textwrap
import time

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from jaxformer.errors import CheckpointError, UserError, first_line
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.metadata import CheckpointMetadata
from tests.run.two_processes import run_two_processes, start_two_processes

PROGRAM = textwrap.dedent(
    """
    import faulthandler, json, pathlib, shutil, sys
    faulthandler.dump_traceback_later(100, exit=True)  # a hang is a failure with the stack, not a stuck suite
    import jax
    jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    from jax.experimental import multihost_utils
    from jaxformer.run.checkpoint import Checkpointer

    directory = pathlib.Path(sys.argv[3])
    checkpointer = Checkpointer(directory, keep=None)
    multihost_utils.sync_global_devices("both listed the steps")
    if sys.argv[4:] == ["removed"] and jax.process_index() == 0:  # by hand, say, after the run listed it
        shutil.rmtree(directory / "5")
    checkpointer.set_aside(5)
    print(json.dumps([sorted(path.name for path in directory.iterdir()), checkpointer.steps()]))
    checkpointer.close()
    """
)


@pytest.mark.slow  # two processes starting jax.distributed, about 5 s; the rule alone is below
@pytest.mark.xdist_group("distributed-processes")
def test_a_step_set_aside_in_two_processes_is_renamed_once_and_seen_by_both(tmp_path):
    directory = tmp_path / "checkpoints"
    (directory / "5").mkdir(parents=True)
    (directory / "5" / "state").write_text("what a damaged step held")
    script = tmp_path / "set_aside.py"
    script.write_text(PROGRAM)
    outputs = run_two_processes(script, str(directory))
    (aside,) = directory.glob("5.damaged-*")
    assert sorted(path.name for path in directory.iterdir()) == [aside.name]
    assert (aside / "state").read_text() == "what a damaged step held"
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert seen == [[[aside.name], []]] * 2  # process 1 too returned after the rename
    warnings = [error.count("moved the damaged checkpoint of step 5") for _, error in outputs]
    assert warnings == [1, 0]  # the process that moved it says so


@pytest.mark.slow  # two processes starting jax.distributed, about 5 s; the rule alone is below
@pytest.mark.xdist_group("distributed-processes")
def test_a_step_process_0_cannot_set_aside_stops_both_processes_at_once(tmp_path):
    directory = tmp_path / "checkpoints"
    (directory / "5").mkdir(parents=True)
    script = tmp_path / "set_aside.py"
    script.write_text(PROGRAM)
    processes = start_two_processes(script, str(directory), "removed")
    try:  # a barrier left process 1 waiting for the minutes of jax's distributed timeout
        outputs = [process.communicate(timeout=60) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [process.returncode != 0 for process in processes] == [True, True]
    (reason,) = [line for line in outputs[0][1].splitlines() if line.startswith("FileNotFoundError: ")]
    assert f"'{directory / '5'}' -> '{directory / '5.damaged-'}" in reason
    told = [line for line in outputs[1][1].splitlines() if "CheckpointError: " in line]
    assert told == [f"jaxformer.errors.CheckpointError: process 0 could not set step 5 aside in {directory} ({reason})"]


class ProcessesOfTwo:
    """jax as each of two processes sees it, their collectives faked: in an exchange of process 0's
    outcome each gets what process 0 last sent (what it sends itself, before process 0 sent anything),
    and a barrier returns at once, as if process 0 had reached it."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.sent = monkeypatch, []
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", self.broadcast_one_to_all)
        monkeypatch.setattr(multihost_utils, "sync_global_devices", lambda name: None)

    def be(self, index: int) -> None:
        self.monkeypatch.setattr(jax, "process_index", lambda: index)

    def broadcast_one_to_all(self, values):
        self.sent.append((jax.process_index(), values))
        from_0 = [values for index, values in self.sent if index == 0]
        return from_0[-1] if from_0 else values


def test_a_process_other_than_0_leaves_the_renaming_to_process_0_and_waits_for_it(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    (directory / "5").mkdir(parents=True)
    checkpointer = Checkpointer(directory, keep=None)
    processes = ProcessesOfTwo(monkeypatch)
    processes.be(1)
    checkpointer.set_aside(5)
    assert sorted(path.name for path in directory.iterdir()) == ["5"]  # process 0's to rename
    processes.be(0)
    checkpointer.set_aside(5)
    (aside,) = directory.iterdir()
    assert aside.name.startswith("5.damaged-")
    assert [index for index, _ in processes.sent] == [1, 0]  # each waited for process 0's word
    monkeypatch.undo()
    checkpointer.close()


def test_a_step_process_0_cannot_set_aside_is_an_error_in_the_other_process_too(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    (directory / "5").mkdir(parents=True)
    checkpointer = Checkpointer(directory, keep=None)
    shutil.rmtree(directory / "5")  # after the listing: by hand, say
    processes = ProcessesOfTwo(monkeypatch)
    processes.be(0)
    with pytest.raises(FileNotFoundError) as raised:
        checkpointer.set_aside(5)
    processes.be(1)
    started = time.monotonic()
    with pytest.raises(CheckpointError) as told:
        checkpointer.set_aside(5)
    assert time.monotonic() - started < 1
    expected = f"process 0 could not set step 5 aside in {directory} (FileNotFoundError: {raised.value})"
    assert str(told.value) == expected and f"'{directory / '5'}' -> " in expected
    monkeypatch.undo()
    checkpointer.close()


def test_a_step_process_0_cannot_move_aside_to_replace_it_is_an_error_in_both_before_anything_is_saved(
    tmp_path, monkeypatch
):
    directory = tmp_path / "best"
    (directory / "5").mkdir(parents=True)
    checkpointer = Checkpointer(directory, keep=None)
    (directory / "5.replacing" / "state").mkdir(parents=True)  # the name taken after the folder was put right
    metadata = CheckpointMetadata(config={}, model={}, tokenizer=b"", data_fingerprint=None, step=5)
    processes = ProcessesOfTwo(monkeypatch)
    processes.be(0)
    with pytest.raises(UserError) as raised:  # one line: a traceback before
        checkpointer.save_params(5, {"w": np.zeros(3, np.float32)}, metadata)
    refused = raised.value.__cause__
    assert isinstance(refused, OSError)
    assert str(raised.value) == f"cannot save checkpoint 5 in {directory}: {type(refused).__name__}: {refused}"
    processes.be(1)
    with pytest.raises(CheckpointError) as told:
        checkpointer.save_params(5, {"w": np.zeros(3, np.float32)}, metadata)
    assert str(told.value) == (
        f"process 0 could not move step 5 aside to replace it in {directory} ({type(refused).__name__}: {refused})"
    )
    assert sorted(path.name for path in directory.iterdir()) == ["5", "5.replacing"]
    assert not any((directory / "5").iterdir())
    monkeypatch.undo()
    checkpointer.close()


def test_a_step_process_0_cannot_set_aside_to_save_it_again_is_one_line_in_both(tmp_path, monkeypatch):
    """What held the name of a step to save is set aside first; process 0's rename refused (a
    checkpoints folder made read-only, a folder gone) was a traceback there (exit 1)."""
    from tests.run.test_checkpoint_integrity import METADATA, make_iterator, make_state

    directory = tmp_path / "checkpoints"
    (directory / "5").mkdir(parents=True)
    checkpointer = Checkpointer(directory, keep=None)
    shutil.rmtree(directory / "5")  # after the listing
    processes = ProcessesOfTwo(monkeypatch)
    for index in (0, 1):
        processes.be(index)
        with pytest.raises(UserError) as raised:
            checkpointer.save(5, make_state(5), make_iterator(), METADATA.replace(step=5))
        refused = first_line(raised.value.__cause__) if index == 0 else refused
        assert f"'{directory / '5'}' -> '{directory / '5.damaged-'}" in refused
        assert str(raised.value) == (
            f"cannot save checkpoint 5 in {directory}: {refused}"
            if index == 0
            else f"process 0 could not set step 5 aside in {directory} ({refused})"
        )
    monkeypatch.undo()
    checkpointer.close()
