"""What process 0 alone does while a multi-process run prepares (the dataset, the tokenizers'
files): its error is raised in every process, the others quoting it, where it ended process 0 and
left the others in their next collective until jax's 5-minute distributed timeout (exit 134)."""

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from jaxformer.training import processes, run_start
from tests.training.test_distributed import limited_processes


def test_a_dataset_process_0_fails_to_prepare_is_an_error_in_the_others_at_once(monkeypatch):
    """Process 1's view: process 0 met a data error while preparing; no barrier waits for it."""
    failed = "DataError: line 7 of train.de is not UTF-8"
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)

    def process_allgather(value):  # [process 0's, this process's]
        if np.ndim(value) == 0:
            return np.asarray([1, value], np.int32)
        told = np.zeros_like(value)
        told[: len(failed)] = np.frombuffer(failed.encode(), np.uint8)
        return np.stack([told, value])

    def waited(name):
        raise AssertionError(f"waited at {name!r} for a process 0 that had stopped")

    monkeypatch.setattr(multihost_utils, "process_allgather", process_allgather)
    monkeypatch.setattr(multihost_utils, "sync_global_devices", waited)
    monkeypatch.setattr(run_start, "prepare", lambda builder: pytest.fail("process 1 prepared the dataset"))
    with pytest.raises(processes.AnotherProcessError) as error:
        run_start.prepare_data(None, None, ("en", "de"))
    assert str(error.value) == f"process 0 of the run stopped before any work: {failed}"


@pytest.mark.slow  # two train.py processes on localhost, about 10 s
@pytest.mark.xdist_group("distributed-processes")
def test_a_tokenizer_process_0_cannot_write_stops_both_processes_with_one_line(data_dir, tmp_path):
    """A file-size limit on process 0's host (a full disk alike) fails its write of tokenizer.model:
    process 0 says so on one line, and process 1 quotes it, both exit 2 within seconds."""
    # Under the tokenizer's 250 kB, above what the run writes before it.
    codes, logs = limited_processes(
        tmp_path / "run", data_dir, "--config.data.input_shards=2", limited=0, file_bytes=200_000, timeout=60
    )
    assert codes == [2, 2], [log[-2000:] for log in logs]
    own = logs[0].strip().splitlines()[-1]
    assert own.startswith("error: File too large: a file-size limit (ulimit -f, or the file system's) stops it")
    told = logs[1].strip().splitlines()[-1]
    assert told == "error: process 0 of the run stopped before any work: OSError: [Errno 27] File too large"
