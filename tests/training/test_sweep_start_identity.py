"""jaxformer-sweep's check that a fine-tuned run it would count started from the parameters its
start holds now, not only from its path and step: a start's run trained again in its workdir
saves other parameters at the same step. The runs are test_sweep_checks.py's stand-ins."""

import json
import shutil

import pytest

from tests.conftest import make_workdir
from tests.training.test_loop import ONE_LAYER
from tests.training.test_sweep import SHARED
from tests.training.test_sweep_checks import runs, sweep  # noqa: F401  (runs: a fixture)

pytestmark = pytest.mark.xdist_group("sweep")


def test_a_run_whose_start_was_trained_again_at_the_same_step_is_refused(tmp_path, capsys, runs):  # noqa: F811
    parent, _, _ = make_workdir(tmp_path / "parent")
    shared = [flag for flag in SHARED if flag not in ONE_LAYER] + [f"--config.training.init_from={parent}"]
    code, err = sweep(tmp_path, capsys, {"baseline": []}, shared=shared)
    assert code == 0, err
    saved = tmp_path / "sweep" / "baseline" / "saved.json"
    (then,) = json.loads(saved.read_text())["started_from_params"].values()
    shutil.rmtree(parent)
    make_workdir(parent, scale=lambda step: 2.0)  # another run's step 1, at the same path
    runs.trained.clear()
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}, shared=shared)
    run_dir = tmp_path / "sweep" / "baseline"
    assert code == 2 and err.count("\n") == 1, err
    now = err.split(" now)")[0].rsplit(", ", 1)[1]
    assert len(now) == 32 and now != then
    assert err == (
        f"error: variant 'baseline' finished in {run_dir} started from training.init_from: step 1 of "
        f"{parent / 'checkpoints'}, which holds other parameters now (training.init_from: parameters {then} then, "
        f"{now} now): another run was saved there since; they would not compare; restore that start, sweep in a "
        f"new --workdir, or remove {run_dir} to train it again\n"
    )
    assert runs.trained == []  # lr3 was not trained from the other start

    # A run recorded before the identity was (read as None): its start's path and step alone are compared, as before.
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "started_from_params": None}))
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}, shared=shared)
    assert code == 0, err
    assert runs.trained == ["lr3"]
