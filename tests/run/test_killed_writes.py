"""A run killed outright while it wrote one of its files whole left the temporary beside it for
good; the next run, once it holds the workdir's lock, removes those of its own files, and nothing
else (run/killed_writes.py)."""

import logging
import os
import signal
import subprocess
import sys
import textwrap

from jaxformer.run.directory import RunDirectory
from jaxformer.training import run_start

# A child that writes `path` with write_bytes_atomically and is killed where it would rename it.
KILLED_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    from jaxformer import files
    os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
    files.write_bytes_atomically(sys.argv[1], b"half")
    """
)


def killed_while_writing(path):
    """The temporary that a process killed while writing `path` left, as the real writer names it."""
    before = set(path.parent.iterdir())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(path)], env=env, timeout=60)
    assert result.returncode == -signal.SIGKILL
    (left,) = set(path.parent.iterdir()) - before
    return left


def test_a_run_removes_what_its_killed_writes_left_and_nothing_else(tmp_path, caplog):
    run = RunDirectory(tmp_path / "run")
    metadata = run.checkpoints / "20" / "metadata"
    averaged = run.averaged / "20" / "metadata"
    for folder in (metadata, averaged):
        folder.mkdir(parents=True)
    run.tokenizer_file.write_bytes(b"a whole model")
    left = [killed_while_writing(path) for path in (run.tokenizer_file, run.last_metrics_file, metadata / "metadata")]
    assert left[0].name.startswith(".tokenizer.model.") and left[0].read_bytes() == b"half"
    kept = [
        killed_while_writing(averaged / "metadata"),  # jaxformer-average-checkpoints' own, beside a run
        killed_while_writing(run.path / "notes.txt"),  # not a file of the run's
        run.path / ".tokenizer.model.0123abc.tmp",  # not as the writer names them: a user's
        run.path / ".tokenizer.model.0123ABCD.tmp",
        run.path / "tokenizer.model.0123abcd.tmp",
    ]
    for path in kept[2:]:
        path.write_text("a user's")
    folder = run.path / ".tokenizer.target.model.0123abcd.tmp"  # a folder: never a writer's temporary
    folder.mkdir()
    with caplog.at_level(logging.WARNING, logger="jaxformer.run.killed_writes"):
        lock = run_start.hold_workdir(run.path)
    lock.release()
    assert not any(path.exists() for path in left)
    assert all(path.exists() for path in kept) and folder.is_dir()
    assert run.tokenizer_file.read_bytes() == b"a whole model"
    warnings = sorted(record.getMessage() for record in caplog.records)
    destinations = (run.tokenizer_file, run.last_metrics_file, metadata / "metadata")
    assert warnings == sorted(
        f"removed {path}, left by a run killed while writing {destination}"
        for path, destination in zip(left, destinations)
    )
