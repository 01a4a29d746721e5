"""A fine-tuned run records the identity of the parameters it started from (their checksums'
digest, run/checksums.py params_digest) beside the start's path and step, which another run
trained into the start's workdir would hold too; resumed, it reads no start and carries that
record. A sweep's use of it: test_sweep_start_identity.py."""

import logging
import shutil

import pytest

from jaxformer.run.loading import load_checkpoint
from jaxformer.training.loop import train_and_evaluate
from tests.training.test_init_from import tiny_config

pytestmark = pytest.mark.xdist_group("init-from")

STEPS = {"num_train_steps": 2, "eval_every_steps": 2, "checkpoint_every_steps": 2}


@pytest.mark.slow  # three tiny runs and a resume: about a minute
def test_a_fine_tuned_run_records_its_starts_parameters_and_resumes_without_reading_it(data_dir, tmp_path, caplog):
    parent, child = tmp_path / "parent", tmp_path / "child"
    train_and_evaluate(tiny_config(data_dir, **STEPS), parent)
    started = load_checkpoint(parent, params=False)[1].params_digest
    train_and_evaluate(tiny_config(data_dir, init_from=str(parent), **STEPS), child)
    _, recorded, _ = load_checkpoint(child, params=False)
    assert recorded.started_from == f"training.init_from: step 2 of {parent / 'checkpoints'}"
    assert recorded.started_from_params == {"training.init_from": started} and len(started) == 32

    # Another run (another seed) trained into the start's workdir: the same path and step, other parameters.
    shutil.rmtree(parent)
    train_and_evaluate(tiny_config(data_dir, seed=1, **STEPS), parent)
    assert load_checkpoint(parent, params=False)[1].params_digest != started
    # Resumed, the run restores its own checkpoint: it reads no start, and keeps the record of the one it read.
    with caplog.at_level(logging.INFO):
        last = train_and_evaluate(
            tiny_config(data_dir, init_from=str(parent), **{**STEPS, "num_train_steps": 3}), child
        )
    assert last["step"] == 3 and "training.init_*from only set where a new run starts" in caplog.text
    _, resumed, _ = load_checkpoint(child, params=False)
    assert (resumed.step, resumed.started_from, resumed.started_from_params) == (
        3,
        recorded.started_from,
        {"training.init_from": started},
    )
