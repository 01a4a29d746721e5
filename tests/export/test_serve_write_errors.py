"""serve.py's writing of stdout failing: stdout closed, a full disk (exit 75) and a reader gone
(exit 141) as for translate.py, and any other error in one line naming <stdout> and the OS's
reason, exit 2, what was written kept."""

import errno
import io
import os
import pathlib
import subprocess
import sys

import pytest

from jaxformer.errors import EXIT_NO_SPACE
from jaxformer.export import standalone
from tests.export.serving import UpperCase

pytestmark = pytest.mark.xdist_group("export")


class FailingOutput(io.RawIOBase):
    """A file that takes `room` bytes, then fails every write with `error_number`, as a disk with
    an I/O error or a file at `ulimit -f` does; `descriptor` is a real file's, for serve.py's
    pointing of stdout at /dev/null."""

    def __init__(self, descriptor, room, error_number):
        self.descriptor, self.room, self.error_number, self.taken = descriptor, room, error_number, b""

    def writable(self):
        return True

    def fileno(self):
        return self.descriptor

    def write(self, data):
        if not self.room:
            raise OSError(self.error_number, os.strerror(self.error_number))
        count = min(len(data), self.room)
        self.taken, self.room = self.taken + bytes(data[:count]), self.room - count
        return count


@pytest.mark.parametrize(("room", "error_number"), [(0, errno.EACCES), (9, errno.EIO), (9, errno.EFBIG)])
def test_serve_py_failing_to_write_stdout_says_so_in_one_line(tmp_path, capsys, monkeypatch, room, error_number):
    """Every write error but a full disk's and a closed pipe's ended in an OSError traceback: now
    one line naming <stdout> and the OS's reason, exit 2, what was written kept as it was."""
    monkeypatch.setattr(standalone, "load", lambda *args: UpperCase())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a man.\ntwo dogs.\n"), encoding="utf-8"))
    with open(tmp_path / "out", "wb") as file:
        output = FailingOutput(file.fileno(), room, error_number)
        stdout = io.TextIOWrapper(io.BufferedWriter(output, buffer_size=4), encoding="utf-8")
        monkeypatch.setattr(sys, "stdout", stdout)
        assert standalone.main([str(tmp_path)]) == 2
    assert output.taken == b"A MAN.\nTWO DOGS.\n"[:room]
    assert capsys.readouterr().err == (
        f"error: {os.strerror(error_number)} writing <stdout>: the translations written stop short of the end\n"
    )


UPPER_CASE_SERVE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))  # `ulimit -f`
from jaxformer.errors import EXIT_NO_SPACE
from jaxformer.export import standalone
class UpperCase:
    translate = staticmethod(lambda sentences: [sentence.upper() * 1000 for sentence in sentences])
standalone.load = lambda *args: UpperCase()
sys.exit(standalone.main(["unused"]))
"""


@pytest.mark.slow  # a subprocess importing jax (2 s): the case above, with the interpreter's exit
def test_serve_py_past_ulimit_f_says_so_once(tmp_path):
    """`ulimit -f` reached (EFBIG, Python ignores SIGXFSZ): one line, and no second message when the
    interpreter flushes stdout at exit; the file keeps what fitted, a prefix of the translations."""
    limit = 9000
    with open(tmp_path / "out", "wb") as output:
        result = subprocess.run(
            [sys.executable, "-c", UPPER_CASE_SERVE, str(limit)],
            input=b"a man.\ntwo dogs.\n",
            stdout=output,
            stderr=subprocess.PIPE,
            cwd=pathlib.Path(standalone.__file__).parents[2],
        )
    assert result.returncode == 2
    assert result.stderr.decode() == (
        f"error: {os.strerror(errno.EFBIG)} writing <stdout>: the translations written stop short of the end\n"
    )
    assert (tmp_path / "out").read_bytes() == (b"A MAN." * 1000 + b"\n" + b"TWO DOGS." * 1000 + b"\n")[:limit]


def test_serve_py_output_failures_are_one_line_with_translates_exit_codes(tmp_path, capsys, monkeypatch):
    """`python serve.py > /dev/full` ended in an OSError traceback once everything was translated,
    and `>&-` in an AttributeError: now translate.py's codes, 75 for a full disk, 2 for stdout closed
    (before the export is read)."""

    def no_loading(*args):
        raise AssertionError("the export was read")

    monkeypatch.setattr(standalone, "load", no_loading)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a man.\n"), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", None)  # what Python sets when started with fd 1 closed
    assert standalone.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: stdout is closed: serve.py writes the translations to stdout\n"
    monkeypatch.setattr(standalone, "load", lambda *args: UpperCase())
    with open("/dev/full", "w", encoding="utf-8") as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert standalone.main([str(tmp_path)]) == EXIT_NO_SPACE
        assert capsys.readouterr().err == (
            "error: No space left on device writing <stdout>: free space (or quota), then run the same command again\n"
        )


@pytest.mark.slow  # a subprocess that loads the export and translates: the case above, end to end
def test_serve_py_to_a_full_disk_says_so_once(exported):
    with open("/dev/full", "wb") as full:
        result = subprocess.run(
            [sys.executable, str(exported / "serve.py")], input=b"A man.\n", stdout=full, stderr=subprocess.PIPE
        )
    assert result.returncode == EXIT_NO_SPACE
    assert (
        result.stderr.decode().count("\n") == 1 and "No space left on device writing <stdout>" in result.stderr.decode()
    )


def test_serve_py_ends_quietly_when_its_reader_closes_stdout(exported):
    """`python serve.py < in | true`: exit 141 as SIGPIPE, no BrokenPipeError traceback."""
    process = subprocess.Popen(
        [sys.executable, str(exported / "serve.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader is gone before anything is written
    _, error = process.communicate(b"A man rides a horse.\nTwo dogs.\n", timeout=300)
    assert process.returncode == 141, error.decode()
    assert b"Traceback" not in error and b"Exception ignored" not in error
