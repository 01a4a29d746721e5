"""A command interrupted midway by a test: a child Python process runs a script that marks the
moment to interrupt it (a file it writes), and the test waits for that mark, then signals it.
Here, not in a subfolder: tests/export (a SIGTERM mid-export) and tests/interop (a kill -9
mid-convert) share it."""

import contextlib
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).parents[1]


@contextlib.contextmanager
def child_that_wrote(
    marker: pathlib.Path, script: str, *args, timeout: float, stdout=subprocess.PIPE
) -> Iterator[subprocess.Popen]:
    """`python -c SCRIPT ARGS` in the repository root, this checkout's jaxformer importable, stderr
    a text pipe, once it has written `marker`; the test fails with its stderr if it ends first, or
    after `timeout` seconds. Killed when the block ends, whatever the test did with it, and
    `marker` removed."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert child.poll() is None, child.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"the child wrote no {marker.name} in {timeout} s"
            time.sleep(0.02)
        yield child
    finally:
        child.kill()
        child.wait()
        child.stderr.close()
        marker.unlink(missing_ok=True)
