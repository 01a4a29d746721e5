"""run_command's exits besides the user's errors: a full disk is one line and exit 75 (retry
once there is space), not a bug's traceback; orbax's writer threads log their failures without
their tracebacks."""

import errno
import logging
import os
import sys

import pytest

from jaxformer.commands import common
from jaxformer.errors import EXIT_NO_SPACE, no_space_error


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
