"""A checkpoint set aside in a run of two processes (jax.distributed on localhost, CPU devices), as
a damaged one is when the run resumes: process 0 renames it, once, and every process returns only
once it is renamed (each renaming the one folder, all but the first found it gone)."""

import json
import textwrap

import jax
import pytest
from jax.experimental import multihost_utils

from jaxformer.run.checkpoint import Checkpointer
from tests.run.two_processes import run_two_processes

PROGRAM = textwrap.dedent(
    """
    import faulthandler, json, pathlib, sys
    faulthandler.dump_traceback_later(100, exit=True)  # a hang is a failure with the stack, not a stuck suite
    import jax
    jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    from jaxformer.run.checkpoint import Checkpointer

    directory = pathlib.Path(sys.argv[3])
    checkpointer = Checkpointer(directory, keep=None)
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


def test_a_process_other_than_0_leaves_the_renaming_to_process_0_and_waits_for_it(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    (directory / "5").mkdir(parents=True)
    checkpointer = Checkpointer(directory, keep=None)
    barriers = []
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "sync_global_devices", barriers.append)
    checkpointer.set_aside(5)
    assert sorted(path.name for path in directory.iterdir()) == ["5"]  # process 0's to rename
    assert barriers == [f"jaxformer: {directory}: step 5 set aside"]
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    checkpointer.set_aside(5)
    (aside,) = directory.iterdir()
    assert aside.name.startswith("5.damaged-") and len(barriers) == 2
    monkeypatch.undo()
    checkpointer.close()
