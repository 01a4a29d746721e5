"""The final choice's candidates when the run has fewer checkpoints than training.average_last."""

import logging

import jax
import numpy as np
import pytest

from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.training.final_choice import _candidates
from tests.conftest import make_workdir


@pytest.mark.parametrize("steps", [(1,), (1, 2), (1, 2, 3)])
def test_an_average_of_the_checkpoints_there_are_with_a_warning(steps, tmp_path, caplog):
    workdir, _, _ = make_workdir(tmp_path / "run", steps=steps, scale=lambda step: float(step))
    step, metadata, params = load_checkpoint(workdir)
    with caplog.at_level(logging.WARNING):
        candidates = _candidates(RunDirectory(workdir), 3, step, params, metadata, None)
    warnings = [record.getMessage() for record in caplog.records if "final choice" in record.getMessage()]
    if len(steps) == 3:  # as many as asked: no warning
        assert warnings == []
    else:
        assert warnings == [
            f"final choice: the run has {len(steps)} checkpoint(s), fewer than training.average_last=3; "
            + ("no average is a candidate" if len(steps) == 1 else f"the average is of those {len(steps)}")
        ]
    assert ("averaged" in candidates) == (len(steps) >= 2)
    if "averaged" in candidates:  # the mean of every step's parameters (step k holds k times the first)
        first = load_checkpoint(workdir, 1)[2]
        mean = np.mean(steps)
        averaged = candidates["averaged"][1]
        for got, base in zip(jax.tree.leaves(averaged), jax.tree.leaves(first), strict=True):
            np.testing.assert_allclose(got, mean * np.asarray(base), rtol=1e-5, atol=1e-7)
