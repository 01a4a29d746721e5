"""The final choice's candidates when the run has fewer checkpoints than training.average_last, the
alphas it names, and a choice of a fine-tuning run's start (best/ at step 0), which it and the summary name."""

import logging
import shutil
import types

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.commands.run_summary import run_summary
from jaxformer.run.checkpoint import Checkpointer
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


def test_a_final_choice_of_the_start_says_so(decoding_workdir, tmp_path, monkeypatch, caplog):
    """best/ holds parameters that score higher than the latest: at step 0, a fine-tuning run's start
    that no step beat, the final choice warns that final/ holds the starting parameters and the run's
    summary names the start; at another step, neither says a word of a start."""
    workdir = tmp_path / "run"
    shutil.copytree(decoding_workdir, workdir)
    _, metadata, params = load_checkpoint(workdir)
    run = RunDirectory(workdir)
    total = sum(float(np.sum(np.abs(leaf))) for leaf in jax.tree.leaves(params))

    class ScoredByScale(scored_validation(lambda settings: 0.0)):  # 10 per multiple of the checkpoint's parameters
        def score(self, params):
            scale = sum(float(np.sum(np.abs(leaf))) for leaf in jax.tree.leaves(params)) / total
            return {**super().score(params), "bleu": 10.0 * scale}

    monkeypatch.setattr(final_choice, "ValidationSet", ScoredByScale)
    config = ml_collections.ConfigDict(metadata.config)
    config.training.update(average_last=1, final_alphas=(), init_from="/runs/source")
    tokenizers = types.SimpleNamespace(source=None, target=None)
    for best_step in (1, 0):  # the run ends at step 2 (its latest parameters those of checkpoint 1)
        for folder in (run.best, run.final):
            shutil.rmtree(folder, ignore_errors=True)
        best = Checkpointer(run.best, keep=None)
        tripled = jax.tree.map(lambda leaf: 3 * leaf, params)
        best.save_params(best_step, tripled, metadata.replace(step=best_step, bleu=3.0))
        best.close()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            result = final_choice.choose_final(config, None, tokenizers, None, run, 2, params, metadata)
        assert (result["latest/bleu"], result["best/bleu"]) == pytest.approx((10.0, 30.0))
        assert result["chosen"] == "best"
        said = [record.getMessage() for record in caplog.records if "start" in record.getMessage()]
        lines = run_summary(config, workdir, {"step": 2, "first_step": 0, "final": result}, 1.0)
        best_line, choice_line = (next(line for line in lines if line.startswith(s)) for s in ("best val", "final c"))
        final = f"(validation BLEU 30.00), in {run.final}"
        if best_step == 0:
            assert said == [
                "final choice: best/ holds the start (step 0: the parameters of training.init_from=/runs/source), "
                f"which scored higher on the validation split than every candidate this run trained; {run.final} "
                "holds the starting parameters"
            ]
            start = "the start (training.init_from): no step scored higher"
            assert best_line == f"best validation BLEU: 3.00 at step 0, {start}"
            assert choice_line == f"final choice: best (the start, step 0), alpha 0.6 {final}"
        else:
            assert said == [] and best_line == "best validation BLEU: 3.00 at step 1"
            assert choice_line == f"final choice: best, alpha 0.6 {final}"
