import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys

import jax
import jaxtyping
import pytest

from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from tests.conftest import make_workdir, read_raw

# Small enough to decode quickly; sources over 32 tokens are translated in pieces.
FLAGS = ["--beam_size", "3", "--max_extra_length", "8", "--batch_size", "4", "--max_source_tokens", "32"]


@pytest.fixture
def symbolic_shapes_unchecked():
    """Turns off the test session's runtime shape checks (tests/conftest.py) for exports traced
    in-process: jaxformer annotates sizes (lengths, batch sizes) as `int`, and jax.export's
    symbolic dimensions are not ints. The command, run in a subprocess, exports without them, as
    a user's does."""
    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", previous)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    """A run with a latest and a different best checkpoint (its parameters scaled by 1.5)."""
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("export") / "run")
    step, metadata, params = load_checkpoint(workdir)
    best = Checkpointer(RunDirectory(workdir).best, keep=None)
    best.save_params(step, jax.tree.map(lambda leaf: leaf * 1.5, params), metadata.replace(bleu=12.5))
    best.close()
    return workdir


def export_with_the_command(workdir, output, flags) -> subprocess.CompletedProcess:
    """`jaxformer-export --workdir WORKDIR --checkpoint best --output OUTPUT FLAGS`, the installed
    command as a user runs it, finished and successful."""
    command = shutil.which("jaxformer-export", path=os.path.dirname(sys.executable))
    assert command, f"jaxformer-export is not installed beside {sys.executable}: pip install -e ."
    result = subprocess.run(
        [command, "--workdir", str(workdir), "--checkpoint", "best", "--output", str(output), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"exported step 1 of {workdir} (best checkpoint)" in result.stdout
    return result


@pytest.fixture(scope="session")
def exported(workdir):
    """The export, written by the installed command as a user runs it; shared by the test files
    (read-only: a test that changes an export changes a copy)."""
    output = workdir.parent / "export"
    assert "cpu, cuda, tpu" in export_with_the_command(workdir, output, FLAGS).stdout
    return output


def sentences_in_two_batches(tokenizer) -> list[str]:
    """5 sentences of 17 to 32 tokens, an empty one and one of 40 to 64 tokens (in pieces): with
    FLAGS' --batch_size 4 and --max_source_tokens 32, two batches of 4 rows of 32 tokens, one shape
    to compile (compiling dominates the export tests' time)."""
    lengths = {text: len(tokenizer.encode(text)) for text in read_raw("val.en.gz", 100)}
    short = [text for text, length in lengths.items() if 17 <= length <= 32][:5]
    long = next(text for text, length in lengths.items() if 40 <= length <= 64)
    return [*short[:3], "", long, *short[3:]]


def record_in_program(directory, edit) -> None:
    """Rewrites the program of the export `directory` (a test's copy) as if exported with another
    record: its function's name (Exported.fun_name, "<search> <JSON>") holds `edit(record)` as its
    JSON (None: the search's name alone, as older exports hold it), and config.json the new file's
    SHA-256."""
    config = json.loads((directory / "config.json").read_text())
    path = directory / config["files"]["program"]["name"]
    program = jax.export.deserialize(bytearray(path.read_bytes()))
    search, _, record = program.fun_name.partition(" ")
    record = edit(json.loads(record))
    name = search if record is None else f"{search} {json.dumps(record, sort_keys=True)}"
    path.write_bytes(dataclasses.replace(program, fun_name=name).serialize())
    config["files"]["program"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (directory / "config.json").write_text(json.dumps(config))
