"""A launched command of a multi-process run that failed ends with its own exit code once its wait
for the others is up, where jax's shutdown barrier, waiting for a process killed, held it until
jax aborted it (exit -6); a finished or stopped one waits at exit as before. A collective exchange
whose other end went is one line naming the process gone. The real two-process runs:
tests/training/test_failed_save_killed_process.py, test_lost_process.py."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

from jaxformer.commands import common, failed_exit
from jaxformer.errors import EXIT_USER_ERROR

ROOT = pathlib.Path(__file__).parents[2]

# A command that joined a run as process argv[1] (or none: "-") and ends with argv[2] (an exit code,
# or "raise": an error escaping it); an exit callback waits 3 s, as jax's shutdown barrier waits for
# a process that never comes, then says so. The waits of failed_exit.py shortened to fit the test.
JOINED_COMMAND = """
import atexit, os, sys, time
from jaxformer.commands import failed_exit

failed_exit.OTHERS_WAIT_SECONDS, failed_exit.COORDINATOR_WAIT_SECONDS = 0.5, 1.5
atexit.register(lambda: time.sleep(3) or os.write(2, b"waited\\n"))

def main(argv=None):
    if sys.argv[1] != "-":
        failed_exit.joined_run(int(sys.argv[1]), 2)
    if sys.argv[2] == "raise":
        raise RuntimeError("a bug")
    sys.stderr.write("error: the run failed\\n")
    return int(sys.argv[2])
"""


def launched(tmp_path, cases):
    """Each case's (exit code, stderr, seconds to its end), `launch` running JOINED_COMMAND, all at once."""
    (tmp_path / "joined_command.py").write_text(JOINED_COMMAND)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    launch = "import sys; from jaxformer.commands.launch import launch; sys.exit(launch('joined_command'))"
    start = time.monotonic()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", launch, *case], env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for case in cases
    ]
    results = []
    for process in processes:
        error = process.communicate(timeout=60)[1]
        results.append((process.returncode, error, time.monotonic() - start))
    return results


def test_a_failed_process_of_a_multi_process_run_ends_with_its_code_once_its_wait_is_up(tmp_path):
    other, coordinator, bug = launched(tmp_path, [("1", "2"), ("0", "75"), ("1", "raise")])
    assert other[:2] == (2, "error: the run failed\n")  # ended within the exit callback's 3 s
    assert coordinator[:2] == (75, "error: the run failed\n") and coordinator[2] > 1.5  # its longer wait
    assert bug[0] == 1 and bug[1].rstrip().endswith("RuntimeError: a bug") and "waited" not in bug[1]


def test_a_process_that_finished_stopped_or_ran_alone_waits_at_exit_as_before(tmp_path):
    cases = [("1", "0"), ("1", "143"), ("-", "2")]  # finished, stopped by SIGTERM, a run of one process
    results = launched(tmp_path, cases)
    assert [result[:2] for result in results] == [(int(code), "error: the run failed\nwaited\n") for _, code in cases]


GLOO_RESET = (
    "UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error "
    "[127.0.0.1]:1926: Connection reset by peer"
)


def failing_with(error):
    def body(args):
        raise error

    return body


@pytest.mark.parametrize(
    ("index", "count", "named"), [(0, 2, "process 1"), (1, 2, "process 0"), (0, 3, "another process")]
)
def test_an_exchange_whose_other_end_went_is_one_line_naming_the_process_gone(monkeypatch, capsys, index, count, named):
    """A process killed mid-training: process 0's step failed in gloo's exchange with a traceback."""
    monkeypatch.setattr(failed_exit, "_joined", [])
    failed_exit.joined_run(index, count)
    assert common.run_command(common.make_parser(None), failing_with(ValueError(GLOO_RESET)), []) == EXIT_USER_ERROR
    assert capsys.readouterr().err == (
        f"error: {named} of the run is gone (killed, or ended by an error of its own, which its log says): "
        f"{GLOO_RESET}; run the same command again to resume from the last checkpoint\n"
    )


def test_other_errors_and_a_run_of_one_process_keep_their_traceback(monkeypatch):
    monkeypatch.setattr(failed_exit, "_joined", [])
    with pytest.raises(ValueError, match="Gloo"):  # one process exchanges with none: not a process gone
        common.run_command(common.make_parser(None), failing_with(ValueError(GLOO_RESET)), [])
    failed_exit.joined_run(0, 2)
    with pytest.raises(ValueError, match="UNKNOWN: Gloo all-reduce failed: bad input"):  # a bug, not a process gone
        common.run_command(
            common.make_parser(None), failing_with(ValueError("UNKNOWN: Gloo all-reduce failed: bad input")), []
        )
