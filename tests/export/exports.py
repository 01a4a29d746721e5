"""What the export tests share besides their fixtures (tests/export/conftest.py): the flags an
export is made with, the command run as a user runs it, sentences that fill two batches, and a
program rewritten with another record. A module of its own, because a test module that imports a
conftest.py makes pytest skip registering it as that folder's conftest (its fixtures then go
missing for tests collected after the import, as in `pytest tests/interop tests/export`)."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys

import jax

from tests.conftest import read_raw

# Small enough to decode quickly; sources over 32 tokens are translated in pieces.
FLAGS = ["--beam_size", "3", "--max_extra_length", "8", "--batch_size", "4", "--max_source_tokens", "32"]


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
