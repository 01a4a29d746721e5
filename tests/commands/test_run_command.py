"""run_command's exits besides the user's errors: a full disk is one line and exit 75 (retry
once there is space), not a bug's traceback; orbax's writer threads log their failures without
their tracebacks."""

import errno
import io
import logging
import os
import sys

import pytest

from jaxformer.commands import common
from jaxformer.errors import EXIT_NO_SPACE, EXIT_USER_ERROR, UserError, file_size_limit_error, no_space_error


def test_a_full_disk_is_one_line_and_its_own_exit_code(capsys):
    def body(args):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/m30k/metrics.jsonl")
        except OSError as full:
            raise RuntimeError("Save Finalize thread failed") from full  # as orbax wraps it

    assert common.run_command(common.make_parser(None), body, []) == EXIT_NO_SPACE
    assert capsys.readouterr().err == (
        "error: No space left on device writing /runs/m30k/metrics.jsonl: free space (or quota), then run the same "
        "command again (a training run resumes from its last checkpoint)\n"
    )


def test_verbose_prints_the_traceback_and_keeps_the_exit_code(capsys):
    def user_error(args):
        raise UserError("config.json: key 'x' has value 3; allowed: 1 or 2")

    def full_disk(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/m30k/metrics.jsonl")

    assert common.run_command(common.make_parser(None), user_error, ["--verbose"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last)") and "in user_error" in err
    assert err.endswith("error: config.json: key 'x' has value 3; allowed: 1 or 2\n")
    assert common.run_command(common.make_parser(None), full_disk, ["--verbose"]) == EXIT_NO_SPACE
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last)") and "in full_disk" in err
    assert err.endswith(
        "error: No space left on device writing /runs/m30k/metrics.jsonl: free space (or quota), "
        "then run the same command again (a training run resumes from its last checkpoint)\n"
    )


def test_a_full_disk_in_tensorstore_words_is_found_and_other_errors_stay_bugs(capsys):
    tensorstore = ValueError(
        "RESOURCE_EXHAUSTED: Error writing local file \"x\": No space left on device [os_error_code='28']"
    )
    assert no_space_error(tensorstore).errno == errno.ENOSPC
    assert no_space_error(OSError(errno.EACCES, "Permission denied")) is None

    def bug(args):
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(OSError):
        common.run_command(common.make_parser(None), bug, [])


def test_a_file_size_limit_is_one_line_and_a_users_error(capsys):
    """`ulimit -f` under a checkpoint save: orbax re-raises the write's EFBIG, which names no file."""

    def body(args):
        raise OSError(errno.EFBIG, "File too large")

    assert common.run_command(common.make_parser(None), body, []) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err == (
        "error: File too large: a file-size limit (ulimit -f, or the file system's) stops it; raise it, then run the "
        "same command again (a training run resumes from its last checkpoint)\n"
    )
    tensorstore = ValueError("UNKNOWN: Error writing local file \"x\": File too large [os_error_code='27']")
    assert file_size_limit_error(tensorstore).errno == errno.EFBIG
    assert file_size_limit_error(OSError(errno.ENOSPC, "No space left on device")) is None


def test_a_librarys_thread_failure_is_logged_without_its_traceback():
    quiet = common._QuietLibraries()
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        record = logging.LogRecord(
            "absl", logging.ERROR, "/venv/orbax/checkpoint/_src/futures/future.py", 1, "thread failed", None, None
        )
        record.exc_info = sys.exc_info()
    assert quiet.filter(record) and record.exc_info is None  # the message stays, the traceback goes


def test_a_reader_that_closes_stdout_ends_the_command_quietly_as_sigpipe_would():
    """`jaxformer-translate ... | head -1` on a long output: exit 141, no traceback, nothing on
    stderr (Python's own handling printed a BrokenPipeError's traceback and exited 1)."""
    import subprocess

    program = (
        "import sys\n"
        "from jaxformer.commands import common\n"
        "def body(args):\n"
        "    common.write_lines(None, ['ein Satz'] * 200_000)\n"
        "    return 0\n"
        "sys.exit(common.run_command(common.make_parser(None), body, []))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert process.stdout.read(9) == b"ein Satz\n"
    process.stdout.close()  # as `head -1` does once it has its line
    error = process.stderr.read().decode()
    assert process.wait() == 141, error
    assert error == ""


def _without_unbuffered_output() -> dict[str, str]:
    """The environment of a user's shell: PYTHONUNBUFFERED (which some machines set) would write
    each print at once, hiding what a block-buffered stdout still holds when the command ends."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}


def test_printed_output_whose_reader_went_away_ends_quietly_as_sigpipe_would():
    """`jaxformer-evaluate ... | true` (or `--list_configs`, `--print_config`): what print() left in
    stdout's buffer was flushed by the interpreter at exit, which printed "Exception ignored ...
    BrokenPipeError" and exited 120; the command now flushes it itself and exits 141, quietly."""
    import subprocess

    program = (
        "import sys\n"
        "from jaxformer.commands import common\n"
        "def body(args):\n"
        "    print('BLEU 12.3')\n"
        "    sys.stdin.readline()  # returns once the reader has closed stdout\n"
        "    return 0\n"
        "sys.exit(common.run_command(common.make_parser(None), body, []))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", program],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
        env=_without_unbuffered_output(),
    )
    process.stdout.close()  # as `| true` does, before reading anything
    process.stdin.write(b"\n")
    process.stdin.close()
    error = process.stderr.read().decode()
    assert process.wait() == 141, error
    assert error == ""


def test_a_broken_output_fifo_keeps_what_the_command_printed_to_stdout(tmp_path):
    """evaluate --output FIFO whose reader went away, stdout to a file: the scores printed before
    reach the file (they were discarded with stdout when the FIFO's write failed)."""
    import subprocess

    program = (
        "import errno, sys\n"
        "from jaxformer.commands import common\n"
        "def body(args):\n"
        "    print('BLEU 12.3')\n"
        "    raise BrokenPipeError(errno.EPIPE, 'Broken pipe', 'hypotheses.fifo')  # writing --output\n"
        "sys.exit(common.run_command(common.make_parser(None), body, []))\n"
    )
    with open(tmp_path / "scores.txt", "wb") as scores:
        result = subprocess.run(
            [sys.executable, "-c", program],
            stdout=scores,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=_without_unbuffered_output(),
        )
    assert result.returncode == 141 and result.stderr == b""
    assert (tmp_path / "scores.txt").read_text() == "BLEU 12.3\n"


def test_a_full_device_is_named_in_the_error(tmp_path):
    from jaxformer.files import write_text_atomically

    with pytest.raises(OSError) as error:
        write_text_atomically("/dev/full", "x" * 100_000)
    assert error.value.errno == errno.ENOSPC and error.value.filename == "/dev/full"


def test_a_closed_stdout_is_one_line_before_any_work(tmp_path):
    """`jaxformer-translate ... >&-`: an AttributeError traceback once the translations were made."""
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "jaxformer.commands.translate", "--workdir", str(tmp_path)],
        input="A man.\n",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(1),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == "error: stdout is closed: give --output, or run without closing it\n"


class _FailingStdout(io.StringIO):
    """stdout whose writes fail with `error_number` after `room` characters."""

    def __init__(self, error_number: int, room: int):
        super().__init__()
        self.error_number, self.room = error_number, room

    def write(self, text):
        if len(self.getvalue()) + len(text) > self.room:
            raise OSError(self.error_number, os.strerror(self.error_number))
        return super().write(text)


@pytest.mark.parametrize("error_number", [errno.EIO, errno.EFBIG, errno.EBADF])
def test_stdout_that_fails_to_take_the_output_is_one_line(monkeypatch, capsys, error_number):
    """`jaxformer-translate` to a stdout that fails (an I/O error, `ulimit -f`, a descriptor opened
    read-only) ended with an OSError traceback and exit 1, as for a bug."""
    stdout = _FailingStdout(error_number, room=0)

    def body(args):
        monkeypatch.setattr(sys, "stdout", stdout)
        common.write_lines(None, ["ein Satz"] * 3)
        return 0

    code = common.run_command(common.make_parser(None), body, [])
    error = capsys.readouterr().err
    assert code == EXIT_USER_ERROR
    assert error == f"error: {os.strerror(error_number)} writing <stdout>: the lines written stop short of the end\n"


def test_a_full_stdout_keeps_its_own_line_and_exit_code(monkeypatch, capsys):
    def body(args):
        monkeypatch.setattr(sys, "stdout", _FailingStdout(errno.ENOSPC, room=0))
        common.write_lines(None, ["ein Satz"])
        return 0

    assert common.run_command(common.make_parser(None), body, []) == EXIT_NO_SPACE
    assert "free space (or quota)" in capsys.readouterr().err
