"""best/'s steps after the checkpoint a run resumes from (written by a segment killed before its
next checkpoint) are set aside as `<step>.rolled_back-<time>`, as their metrics records move to
metrics.rolled_back.jsonl: the final choice, the run's summary and the next BLEU's comparison read
only best/'s steps of the history the run goes on from."""

import logging
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.commands.run_summary import best_checkpoint, run_summary
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint, load_from_directory
from jaxformer.training import final_choice, validation_bleu
from jaxformer.training.validation_bleu import BleuValidator, set_aside_rolled_back_best
from tests.conftest import make_workdir, scored_validation
from tests.training.test_loop import checkpoint_steps

pytestmark = pytest.mark.xdist_group("train-loop")


def best_steps(workdir):
    return sorted(int(path.name) for path in (workdir / "best").iterdir() if path.name.isdigit())


def rolled_back(workdir, step):
    return sorted((workdir / "best").glob(f"{step}.rolled_back-*"))


class _ScoredBetweenTheTwo(scored_validation(lambda settings: 25.0)):  # BleuValidator's split: BLEU 25
    def score(self, params):
        return {**super().score(params), "bleu_signature": "stand-in"}


def test_best_steps_after_the_step_resumed_from_are_set_aside(tmp_path, monkeypatch, caplog):
    """best/ holds step 1 (BLEU 20) and step 3 (BLEU 30): a run resumed from checkpoint 3 leaves
    both, one resumed from checkpoint 2 sets step 3 aside, and a new run (no checkpoint to resume
    from) every step."""
    workdir, _, _ = make_workdir(tmp_path / "run", steps=(1, 2))
    step, metadata, params = load_checkpoint(workdir)
    run = RunDirectory(workdir)
    best = Checkpointer(run.best, keep=None)
    for at, bleu in ((1, 20.0), (3, 30.0)):
        best.save_params(at, params, metadata.replace(step=at, bleu=bleu))
    best.close()

    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back_best(run, 3)
    assert best_steps(workdir) == [1, 3] and not list((workdir / "best").glob("*.rolled_back-*"))
    assert not caplog.records

    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back_best(run, 2)
    assert best_steps(workdir) == [1]
    (aside,) = rolled_back(workdir, 3)  # moved, not deleted: whole, the parameters and the BLEU they scored
    assert [record.getMessage() for record in caplog.records] == [
        f"moved {run.best / '3'} to {aside}: a step after step 2, the checkpoint this run resumed from, which this "
        "run trains again; best/ keeps only the steps of the history it goes on from"
    ]
    shutil.copytree(aside, tmp_path / "aside" / "3")
    assert load_from_directory(tmp_path / "aside")[1].bleu == 30.0

    # The final choice's candidates and the summary: best/'s step that is left.
    best_candidate = final_choice._candidates(run, 1, step, params, metadata, None)["best"][0]
    assert (best_candidate.step, best_candidate.bleu) == (1, 20.0)
    config = ml_collections.ConfigDict(metadata.config)
    config.training.bleu_every_steps = 3
    lines = run_summary(config, workdir, {"step": step, "first_step": 2}, 1.0)
    assert [line for line in lines if "best validation BLEU" in line] == ["best validation BLEU: 20.00 at step 1"]

    # The next BLEU (25, at step 3) is compared with best/'s score that is left: it is the best.
    monkeypatch.setattr(validation_bleu, "ValidationSet", _ScoredBetweenTheTwo)
    validator = BleuValidator(config, None, None, None, workdir)
    assert validator.best_bleu == 20.0
    validator(3, params, metadata)
    validator.close()
    assert best_checkpoint(run) == (3, 25.0)

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back_best(run, -1)
    assert best_steps(workdir) == [] and len(rolled_back(workdir, 3)) == 2
    assert "a step of an earlier run with no checkpoint to resume from, which this run trains again" in caplog.text


@pytest.mark.slow  # three short in-process runs with validation BLEU and the final choice (about 30 s)
def test_a_run_resumed_before_its_best_step_ends_with_the_best_of_its_own_history(
    data_dir, tmp_path, monkeypatch, caplog
):
    """A run of 4 steps (checkpoints every 2, BLEU every 3) dies after step 3's BLEU saved best/3,
    before checkpoint 4. Resumed with the same command, it sets best/3 aside and writes the same
    best/3 again; resumed to end at step 2, best/3 is no candidate of its final choice, nor its
    summary's best."""
    from jaxformer.training import loop
    from jaxformer.training.config_file import apply_overrides
    from tests.training.test_signals import _four_step_config

    config = _four_step_config(data_dir, final_choice=True)
    apply_overrides(config, [("training.bleu_every_steps", "3"), ("training.bleu_examples", "8")])
    workdir = tmp_path / "run"

    class Killed(BaseException):
        pass

    real_run_due = loop.run_due

    def killed_after_step_3(periodic, step, end, *timing):
        real_run_due(periodic, step, end, *timing)
        if step == 3:
            raise Killed

    monkeypatch.setattr(loop, "run_due", killed_after_step_3)
    with pytest.raises(Killed):
        loop.train_and_evaluate(config, workdir)
    monkeypatch.setattr(loop, "run_due", real_run_due)
    assert checkpoint_steps(workdir) == [2] and best_steps(workdir) == [3]
    _, killed_best, killed_params = load_from_directory(workdir / "best")
    shutil.copytree(workdir, tmp_path / "shortened", symlinks=True)

    # The same command: best/3 set aside, then written again by step 3's BLEU, bit for bit.
    with caplog.at_level(logging.WARNING):
        loop.train_and_evaluate(config, workdir)
    (aside,) = rolled_back(workdir, 3)
    assert f"moved {workdir / 'best' / '3'} to {aside}: a step after step 2" in caplog.text
    redone_step, redone, redone_params = load_from_directory(workdir / "best")
    assert redone_step == 3 and redone.bleu == killed_best.bleu
    for got, want in zip(jax.tree.leaves(redone_params), jax.tree.leaves(killed_params), strict=True):
        np.testing.assert_array_equal(got, want)

    # Ended at step 2 instead: best/ holds step 2, whose BLEU that end measured, and no other step.
    workdir = tmp_path / "shortened"
    config.training.num_train_steps = 2
    real_candidates, candidates = final_choice._candidates, []
    monkeypatch.setattr(final_choice, "_candidates", lambda *a: candidates.append(real_candidates(*a)) or candidates[0])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        last = loop.train_and_evaluate(config, workdir)
    assert f"moved {workdir / 'best' / '3'} to {rolled_back(workdir, 3)[0]}" in caplog.text
    assert last["step"] == 2 and best_steps(workdir) == [2]
    assert set(candidates[0]) == {"latest"}  # best/ holds the latest step; one checkpoint: no average
    best_step, bleu = best_checkpoint(RunDirectory(workdir))
    assert best_step == 2 and f"best validation BLEU: {bleu:.2f} at step 2" in run_summary(config, workdir, last, 1.0)
