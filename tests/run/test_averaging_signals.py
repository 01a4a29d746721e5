"""A Ctrl-C while jaxformer-average-checkpoints writes its average: it stops at once, as every
command stops on one, and the same command then writes the average whole."""

import glob
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from tests.conftest import make_workdir
from tests.training.test_loop import ROOT, environment


def average(workdir, **popen):
    command = [sys.executable, "-m", "jaxformer.commands.average_checkpoints", "--workdir", str(workdir), "--last", "2"]
    return subprocess.Popen(command, env=environment(), cwd=ROOT, text=True, **popen)


@pytest.mark.slow  # four real averagings, each interrupted and run again (about 2 min on 2 busy cores)
def test_a_ctrl_c_while_the_average_is_saved_ends_the_command_at_once(tmp_path):
    # Python's KeyboardInterrupt raised inside orbax's save left its threads half done: errors
    # printed ("Failed to run 4 Handler Commit operations"), at times five minutes' wait for a
    # stage of the save that never came, before the process ended.
    workdir, params, _ = make_workdir(tmp_path / "run", steps=(10, 20), scale=lambda step: step / 10)
    delays = (0.0, 0.01, 0.02, 0.05)  # the signal at several points of the save
    ended_first = 0
    for delay in delays:
        process = average(workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while process.poll() is None and not glob.glob(str(RunDirectory(workdir).averaged / "*")):
            time.sleep(0.001)  # the save has begun: orbax's temporary folder is there
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, err = process.communicate(timeout=400)
        assert time.monotonic() - started < 60, err
        errors = [line for line in err.splitlines() if " E " in line or "Error" in line]
        assert errors == [], err
        if process.returncode == 0 and "SIGINT" not in err:  # ended before the signal reached it (a fast machine)
            ended_first += 1
        elif process.returncode == 0:  # held until the save was whole: the average is complete
            assert err.splitlines()[-1] == "SIGINT came as the average was saved: it is complete; exiting with 0"
        else:
            assert process.returncode == 128 + signal.SIGINT and err.splitlines()[-1] == "interrupted", err
        assert not RunDirectory(workdir).averaging_lock_file.exists()
        again = average(workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = again.communicate(timeout=240)
        assert again.returncode == 0, err
        step, _, mean = load_checkpoint(workdir, "averaged")
        assert step == 20 and (RunDirectory(workdir).averaged / "20").is_dir()
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), mean, jax.tree.map(lambda x: x * 1.5, params)
        )
        shutil.rmtree(RunDirectory(workdir).averaged)
    assert ended_first < len(delays)  # at least one signal came during the save
