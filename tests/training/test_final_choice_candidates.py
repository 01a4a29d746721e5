"""The final choice's candidates when the run has fewer checkpoints than training.average_last."""

import logging
import types

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.training import final_choice
from jaxformer.training.final_choice import _candidates
from tests.conftest import make_workdir, scored_validation


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


_ScoredByAlpha = scored_validation(lambda settings: 10.0 + settings.alpha)  # the highest alpha wins


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_the_final_choice_names_an_alpha_only_where_it_compared_alphas(method, tmp_path, monkeypatch, caplog):
    workdir, _, _ = make_workdir(tmp_path / "run", steps=(1, 2))
    step, metadata, params = load_checkpoint(workdir)
    config = ml_collections.ConfigDict(metadata.config)
    config.decoding.method, config.training.final_alphas, config.training.average_last = method, (1.0, 2.0), 2
    monkeypatch.setattr(final_choice, "ValidationSet", _ScoredByAlpha)

    def choose():  # the loop's call at the run's end; no tokenizer or data is read by the stand-in
        tokenizers = types.SimpleNamespace(source=None, target=None)
        return final_choice.choose_final(config, None, tokenizers, None, RunDirectory(workdir), step, params, metadata)

    with caplog.at_level(logging.INFO):
        summary = choose()
    (line,) = [record.getMessage() for record in caplog.records if "final choice at step" in record.getMessage()]
    saved = load_checkpoint(workdir, "final", params=False)[1]
    if method == "beam":  # 0.6 (decoding.alpha), then 1 and 2: 2 scores the highest
        assert summary["alpha"] == saved.alpha == 2.0 and summary["bleu"] == 12.0
        assert "; by alpha (gnmt length penalty): 0.6 10.60, 1 11.00, 2 12.00; chose alpha 2 (saved to" in line
    else:  # a greedy search reads no length penalty: none compared, none named or saved
        assert summary["alpha"] is None and saved.alpha is None and summary["bleu"] == 10.6
        assert "alpha" not in line and not any(key.startswith("alpha_") for key in summary)
    # The same command again (a finished run started again): the choice stays, and so does its report.
    monkeypatch.setattr(_ScoredByAlpha, "score", lambda *_: pytest.fail("the choice was made again"))
    again = choose()
    assert again == summary and {"latest/chrf", "averaged/lowercase_bleu"} <= set(again)
