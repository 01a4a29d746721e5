"""An error of one process's own outside the checkpoints (process 1 alone, mid-training) in a
two-process run (train.py, jax.distributed on localhost): both end within seconds, exit 2, each with
one `error:` line, process 0's naming process 1 as gone. Process 1 waited for process 0 at jax's
shutdown barrier, and process 0 for process 1 in the step's exchange, until both were killed."""

import textwrap

import pytest

from tests.training.test_failed_save_three_processes import hooked_processes


def hooked_train(patch: str) -> str:
    """A wrapper of train.py for `hooked_processes`: `patch` (Python source) runs first, then
    train.py, with the command line that follows the hook's name."""
    run = "import runpy, sys\nsys.argv = sys.argv[2:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    return textwrap.dedent(patch) + run


# train.py, process 1 raising a UserError of its own at its 25th training-metrics flush (step 25).
FAILING_ALONE = hooked_train(
    """
    import jax
    from jaxformer.errors import UserError
    from jaxformer.training import train_metrics

    flushed, calls = train_metrics.TrainMetrics.flush, []

    def flush(self, *args, **kwargs):
        calls.append(None)
        if jax.process_index() == 1 and len(calls) == 25:
            raise UserError("process 1's own failure")
        return flushed(self, *args, **kwargs)

    train_metrics.TrainMetrics.flush = flush
    """
)


@pytest.mark.slow  # two train.py processes on localhost, 25-45 s on 2 shared cores
@pytest.mark.xdist_group("distributed-processes")
def test_one_process_failing_alone_mid_training_ends_both_within_seconds(data_dir, tmp_path):
    codes, logs, spread = hooked_processes(tmp_path, data_dir, "alone", timeout=150, wrapper=FAILING_ALONE, count=2)
    assert codes == [2, 2], [log[-2000:] for log in logs]
    assert spread < 20  # process 1's wait at exit (2 s), then process 0's exchange fails
    gone, own = (log.strip().splitlines()[-1] for log in logs)
    assert own == "error: process 1's own failure"
    assert gone.startswith("error: process 1 of the run is gone (killed, or ended by an error of its own, ")
    assert "Gloo" in gone and "by peer" in gone
    assert [log.count("\nerror: ") for log in logs] == [1, 1] and "Traceback" not in "".join(logs)
