"""A checkpoint save that fails in a training run (a full disk, a file-size limit) ends it with one
line, not with dozens of "RuntimeError: Event loop is closed" tracebacks after that line."""

import resource
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import loop


def test_a_failed_save_in_a_run_leaves_no_event_loop_errors(tmp_path, capfd, monkeypatch):
    """Orbax closes the save's event loop once one write fails; the writes still in flight then
    report to it from tensorstore's threads, through sys.unraisablehook. A file-size limit fails
    a write as a full disk does, without a disk to fill."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: unraisable.append(repr(report.exc_value)))
    rng = np.random.default_rng(0)
    params = {f"layer_{i}": jnp.asarray(rng.standard_normal((32, 64), np.float32)) for i in range(100)}
    metadata = CheckpointMetadata(config={}, model={}, tokenizer=b"\0", data_fingerprint=None, step=1)
    failures = []

    def train(config, prepared, model, preparation):
        for attempt in range(3):  # how many writes are still in flight at the failure varies
            checkpointer = Checkpointer(tmp_path / str(attempt), keep=None)
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, limit[1]))  # Python ignores SIGXFSZ
            try:
                with pytest.raises(Exception, match="File too large") as error:
                    checkpointer.save_params(1, params, metadata)
                    checkpointer.close()
                failures.append(error.value)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        return {}

    prepared = types.SimpleNamespace(mesh=jax.make_mesh((1,), ("data",)), rules=(), model_config=None)
    monkeypatch.setattr(loop.run_start, "prepare_run", lambda config, workdir: prepared)
    monkeypatch.setattr(loop, "build_model", lambda model_config: None)
    monkeypatch.setattr(loop, "_train", train)
    loop._locked_train_and_evaluate(None, tmp_path, None)
    time.sleep(0.5)  # writes left running would report to the closed event loop by now
    assert len(failures) == 3
    assert not unraisable
    assert "Event loop is closed" not in "".join(capfd.readouterr())
