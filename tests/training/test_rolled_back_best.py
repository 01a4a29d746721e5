"""best/'s, averaged/'s and final/'s steps after the checkpoint a run resumes from (written by a
segment killed before its next checkpoint, or by a history whose newest checkpoint was damaged or
removed) are set aside as `<step>.rolled_back-<time>`, as their metrics records move to
metrics.rolled_back.jsonl: the final choice, the run's summary, the next BLEU's comparison and
`--checkpoint best`, `averaged` or `final` read only the steps of the history the run goes on from;
best/ left empty so holds the best-scored step up to the resume point whose checkpoint is kept, or
says why it holds none (training/rolled_back_best.py)."""

import json
import logging
import shutil
import types

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.commands.run_summary import best_checkpoint, run_summary
from jaxformer.errors import CheckpointError
from jaxformer.run.averaging import average_last
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint, load_from_directory
from jaxformer.run.lock import AveragingLock, WorkdirLockedError
from jaxformer.run.rolled_back import set_aside_rolled_back
from jaxformer.training import final_choice, validation_bleu
from jaxformer.training.rolled_back_best import set_aside_rolled_back_keeping_best
from jaxformer.training.validation_bleu import BleuValidator
from tests.conftest import make_workdir, scored_validation
from tests.training.test_loop import checkpoint_steps

pytestmark = pytest.mark.xdist_group("train-loop")


def best_steps(workdir, folder="best"):
    return sorted(int(path.name) for path in (workdir / folder).iterdir() if path.name.isdigit())


def rolled_back(workdir, step, folder="best"):
    return sorted((workdir / folder).glob(f"{step}.rolled_back-*"))


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

    caplog.clear()  # orbax's warning of a slow save above, on a loaded machine, is not this call's
    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back(run, 3)
    assert best_steps(workdir) == [1, 3] and not list((workdir / "best").glob("*.rolled_back-*"))
    assert not caplog.records

    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back(run, 2)
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
        set_aside_rolled_back(run, -1)
    assert best_steps(workdir) == [] and len(rolled_back(workdir, 3)) == 2
    assert "a step of an earlier run with no checkpoint to resume from, which this run trains again" in caplog.text


def test_averaged_and_final_steps_after_the_step_resumed_from_are_set_aside(tmp_path, monkeypatch, caplog):
    """averaged/ holds steps 1 and 3, final/ steps 2 and 3: a history that reached step 3 averaged
    and chose there, then lost checkpoint 3. A run resumed from checkpoint 2 sets averaged/3 and
    final/3 aside (averaged/'s holding averaged.lock, refused while an averaging holds it), so
    `--checkpoint averaged` and `final` read step 1's and step 2's, and its final choice at step 3 is
    made again, beside the one set aside, which stays whole."""
    workdir, _, _ = make_workdir(tmp_path / "run", steps=(1, 2))
    step, metadata, params = load_checkpoint(workdir)
    run = RunDirectory(workdir)
    for folder, steps in ((run.averaged, (1, 3)), (run.final, (2, 3))):
        writer = Checkpointer(folder, keep=None)
        for at in steps:
            writer.save_params(at, params, metadata.replace(step=at, bleu=10.0 * at, chosen_from="best", alpha=0.6))
        writer.close()

    with AveragingLock(workdir), pytest.raises(WorkdirLockedError) as refused:  # an averaging running now
        set_aside_rolled_back(run, 2)
    assert str(refused.value).startswith(
        f"cannot set aside step(s) 3 of {run.averaged}, after step 2, the checkpoint this run resumed from: "
        f"{workdir} is in use by another jaxformer-average-checkpoints: pid "
    )
    assert (best_steps(workdir, "averaged"), best_steps(workdir, "final")) == ([1, 3], [2, 3])  # nothing moved

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back(run, 2)
    assert (best_steps(workdir, "averaged"), best_steps(workdir, "final")) == ([1], [2])
    (averaged_aside,) = rolled_back(workdir, 3, "averaged")
    (final_aside,) = rolled_back(workdir, 3, "final")
    assert [record.getMessage() for record in caplog.records] == [
        f"moved {run.averaged / '3'} to {averaged_aside}: a step after step 2, the checkpoint this run resumed "
        "from, which this run trains again; averaged/ keeps only the steps of the history it goes on from",
        f"moved {run.final / '3'} to {final_aside}: a step after step 2, the checkpoint this run resumed "
        "from, which this run trains again; final/ keeps only the steps of the history it goes on from",
    ]
    assert not (workdir / "averaged.lock").exists()  # released
    assert load_checkpoint(workdir, "averaged", params=False)[0] == 1
    assert load_checkpoint(workdir, "final", params=False)[0] == 2

    # The resumed run's final choice at step 3: made again (every candidate scores 7; latest wins the
    # tie), not the set-aside one kept as if this run had made it.
    monkeypatch.setattr(final_choice, "ValidationSet", scored_validation(lambda settings: 7.0))
    config = ml_collections.ConfigDict(metadata.config)
    config.training.final_choice, config.training.average_last = True, 2
    tokenizers = types.SimpleNamespace(source=None, target=None)
    result = final_choice.choose_final(config, None, tokenizers, None, run, 3, params, metadata)
    assert (result["chosen"], result["bleu"]) == ("latest", 7.0)
    assert best_steps(workdir, "final") == [2, 3] and rolled_back(workdir, 3, "final") == [final_aside]
    chosen_step, chosen = load_checkpoint(workdir, "final", params=False)[:2]
    assert (chosen_step, chosen.chosen_from, chosen.bleu) == (3, "latest", 7.0)
    shutil.copytree(final_aside, tmp_path / "aside" / "3")
    aside = load_from_directory(tmp_path / "aside")[1]
    assert (aside.chosen_from, aside.bleu) == ("best", 30.0)


def killed_after_step_3(config, workdir, monkeypatch):
    """`config`'s run in `workdir`, killed (a BaseException, as SIGKILL leaves it) once step 3's
    periodic work is done, before its next checkpoint."""
    from jaxformer.training import loop

    class Killed(BaseException):
        pass

    real_run_due = loop.run_due

    def killed(periodic, step, end, *timing):
        real_run_due(periodic, step, end, *timing)
        if step == 3:
            raise Killed

    monkeypatch.setattr(loop, "run_due", killed)
    with pytest.raises(Killed):
        loop.train_and_evaluate(config, workdir)
    monkeypatch.setattr(loop, "run_due", real_run_due)


@pytest.mark.slow  # four short in-process runs with validation BLEU and the final choice (about 40 s)
def test_a_run_resumed_before_its_best_step_ends_with_the_best_of_its_own_history(
    data_dir, tmp_path, monkeypatch, caplog
):
    """A run of 4 steps (checkpoints every 2, BLEU every 3) dies after step 3's BLEU saved best/3,
    before checkpoint 4. Resumed with the same command, it sets best/3 aside and writes the same
    best/3 again; then, averaged at step 4 and its checkpoint 4 damaged, it resumes from 2 and sets
    averaged/4 and its final choice aside, choosing again at step 4. Resumed to end at step 2
    instead, best/3 is no candidate of its final choice, nor its summary's best."""
    from jaxformer.training import loop
    from jaxformer.training.config_file import apply_overrides
    from tests.training.test_signals import _four_step_config

    config = _four_step_config(data_dir, final_choice=True)
    apply_overrides(config, [("training.bleu_every_steps", "3"), ("training.bleu_examples", "8")])
    workdir = tmp_path / "run"

    killed_after_step_3(config, workdir, monkeypatch)
    assert checkpoint_steps(workdir) == [2] and best_steps(workdir) == [3]
    _, killed_best, killed_params = load_from_directory(workdir / "best")
    shutil.copytree(workdir, tmp_path / "shortened", symlinks=True)

    # The same command: best/3 set aside, then written again by step 3's BLEU, bit for bit.
    caplog.clear()  # orbax's warning of a slow save above, on a loaded machine, is not this call's
    with caplog.at_level(logging.WARNING):
        loop.train_and_evaluate(config, workdir)
    (aside,) = rolled_back(workdir, 3)
    assert f"moved {workdir / 'best' / '3'} to {aside}: a step after step 2" in caplog.text
    redone_step, redone, redone_params = load_from_directory(workdir / "best")
    assert redone_step == 3 and redone.bleu == killed_best.bleu
    for got, want in zip(jax.tree.leaves(redone_params), jax.tree.leaves(killed_params), strict=True):
        np.testing.assert_array_equal(got, want)

    # Averaged at its end (averaged/4), then checkpoint 4 damaged: the same command resumes from 2,
    # sets averaged/4 and final/4 aside, and makes the choice at step 4 again beside the one set aside.
    average_last(workdir, 2)
    _, first_choice, _ = load_from_directory(workdir / "final")
    for path in (workdir / "checkpoints" / "4" / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
    caplog.clear()
    with caplog.at_level(logging.INFO):
        loop.train_and_evaluate(config, workdir)
    assert "resumed from step 2" in caplog.text and "final choice: already made" not in caplog.text
    (averaged_aside,) = rolled_back(workdir, 4, "averaged")
    (final_aside,) = rolled_back(workdir, 4, "final")
    assert best_steps(workdir, "averaged") == [] and best_steps(workdir, "final") == [4]
    for aside in (averaged_aside, final_aside):
        assert f"moved {aside.parent / '4'} to {aside}: a step after step 2" in caplog.text
    shutil.copytree(final_aside, tmp_path / "aside" / "4")
    assert load_from_directory(tmp_path / "aside")[1] == first_choice  # whole, not overwritten
    _, second_choice, _ = load_from_directory(workdir / "final")  # resumed exactly: the same choice again
    assert (second_choice.chosen_from, second_choice.bleu) == (first_choice.chosen_from, first_choice.bleu)

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


def _bleu_records(workdir, scores):
    with open(RunDirectory(workdir).metrics_file, "a", encoding="utf-8") as handle:
        for step, bleu in scores.items():
            handle.write(json.dumps({"step": step, "eval/bleu": bleu, "eval/best_bleu": bleu}) + "\n")


def test_a_best_step_set_aside_leaves_best_the_best_kept_step(tmp_path, monkeypatch, caplog):
    """Checkpoints 1 and 3 kept; BLEU 20, 30, 25 at steps 1, 2 and 3, and best/4 (BLEU 35) of a
    history after step 3. Resumed from checkpoint 3, best/4 is set aside and best/ holds step 3,
    the best scored of the steps kept (step 2's 30 has no checkpoint), which the next BLEU is
    compared with; resumed from scratch, best/ holds nothing, said once, and `--checkpoint best`
    names why."""
    workdir, _, _ = make_workdir(tmp_path / "run", steps=(1, 3), scale=lambda step: float(step))
    run = RunDirectory(workdir)
    _bleu_records(workdir, {1: 20.0, 2: 30.0, 3: 25.0, 4: 35.0})
    step, metadata, params = load_checkpoint(workdir)
    best = Checkpointer(run.best, keep=None)
    best.save_params(4, params, metadata.replace(step=4, bleu=35.0))
    best.close()
    config = ml_collections.ConfigDict(metadata.config)
    config.training.bleu_every_steps = 1

    caplog.clear()  # orbax's warning of a slow save above, on a loaded machine, is not this call's
    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back_keeping_best(run, 3, config)
    (aside,) = rolled_back(workdir, 4)
    restored_step, restored, restored_params = load_from_directory(run.best)
    assert (restored_step, restored.bleu, best_steps(workdir)) == (3, 25.0, [3])  # was [], until the next BLEU
    for got, want in zip(jax.tree.leaves(restored_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(got, want)  # checkpoint 3's parameters (step 1's are a third of them)
    assert [record.getMessage() for record in caplog.records][1:] == [
        "best/: step 3 (validation BLEU 25.00) written again from its checkpoint, the best scored of the steps up "
        "to step 3 this run goes on from whose parameters are kept; step 2 scored 30.00, but its checkpoint is not "
        "kept"
    ]
    monkeypatch.setattr(validation_bleu, "ValidationSet", _ScoredBetweenTheTwo)
    validator = BleuValidator(config, None, None, None, workdir)
    assert validator.best_bleu == 25.0  # a lower score is no best: was -inf, so any
    validator(4, params, metadata)
    validator.close()
    assert best_checkpoint(run) == (3, 25.0)

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back_keeping_best(run, -1, config)
    assert best_steps(workdir) == []
    assert caplog.records[-1].getMessage() == (
        "best/ holds no step until this run's next validation BLEU: it has no checkpoint to resume from; "
        "--checkpoint best is refused, and the final choice has no best candidate, until then"
    )
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(workdir, "best")
    assert str(refused.value).startswith(
        f"{run.best} holds no checkpoint; its step(s) 3, 4 were set aside ({rolled_back(workdir, 3)[0]}, {aside}) "
    )


class _ScoredInTurn(_ScoredBetweenTheTwo):  # BleuValidator's split: BLEU_IN_TURN's scores, one per BLEU
    def score(self, params):
        return {**super().score(params), "bleu": BLEU_IN_TURN.pop(0)}


BLEU_IN_TURN: list[float] = []


# Two 4-step runs, BLEU stood in (8-16 s): the default suite tests the same rule on the files
# (test_a_best_step_set_aside_leaves_best_the_best_kept_step above).
@pytest.mark.slow
def test_a_run_resumed_before_its_best_step_keeps_its_best_kept_step(data_dir, tmp_path, monkeypatch):
    """A run of 4 steps (checkpoints every 2, BLEU every step) dies after step 3's BLEU (10, 20, 30)
    saved best/3, before checkpoint 4. Resumed, it scores 5 at steps 3 and 4: best/ holds step 2
    (BLEU 20, checkpoint 2), not step 3's 5, which was the best so far, compared with nothing."""
    from jaxformer.training import loop
    from jaxformer.training.config_file import apply_overrides
    from tests.training.test_signals import _four_step_config

    config = _four_step_config(data_dir, final_choice=False)
    apply_overrides(config, [("training.bleu_every_steps", "1")])
    monkeypatch.setattr(validation_bleu, "ValidationSet", _ScoredInTurn)
    workdir = tmp_path / "run"

    BLEU_IN_TURN[:] = [10.0, 20.0, 30.0]
    killed_after_step_3(config, workdir, monkeypatch)
    assert checkpoint_steps(workdir) == [2] and best_steps(workdir) == [3]

    BLEU_IN_TURN[:] = [5.0, 5.0]
    loop.train_and_evaluate(config, workdir)
    assert best_checkpoint(RunDirectory(workdir)) == (2, 20.0)  # was (3, 5.0)
    records = [json.loads(line) for line in RunDirectory(workdir).metrics_file.read_text().splitlines()]
    assert [(record["step"], record["eval/best_bleu"]) for record in records if "eval/bleu" in record] == [
        (1, 10.0),
        (2, 20.0),
        (3, 20.0),
        (4, 20.0),
    ]


def test_a_best_step_cut_short_by_a_kill_as_it_was_replaced_is_set_aside_and_written_again(
    tmp_path, monkeypatch, caplog
):
    """best/3 (BLEU 30) replaced by best/4 (BLEU 35), the run killed while orbax deleted step 3 (its
    metadata file gone first), before checkpoint 4. Resumed from checkpoint 3, best/4 is set aside
    and best/3, unreadable, with it: best/ holds step 3 again, written from its checkpoint, and the
    next BLEU is compared with its 30, as in the run never killed (was: best/ counted the remains as
    the step it holds, so the next BLEU was compared with nothing and became the best however low)."""
    workdir, _, _ = make_workdir(tmp_path / "run", steps=(1, 3), scale=lambda step: float(step))
    run = RunDirectory(workdir)
    _bleu_records(workdir, {1: 20.0, 3: 30.0, 4: 35.0})
    step, metadata, params = load_checkpoint(workdir)
    best = Checkpointer(run.best, keep=None)
    for at, bleu in ((3, 30.0), (4, 35.0)):
        best.save_params(at, params, metadata.replace(step=at, bleu=bleu))
    best.close()
    (run.best / "3" / "metadata" / "metadata").unlink()  # as orbax's deletion of step 3 left it
    config = ml_collections.ConfigDict(metadata.config)
    config.training.bleu_every_steps = 1

    caplog.clear()  # orbax's warning of a slow save above, on a loaded machine, is not this call's
    with caplog.at_level(logging.WARNING):
        set_aside_rolled_back_keeping_best(run, 3, config)
    monkeypatch.setattr(validation_bleu, "ValidationSet", _ScoredBetweenTheTwo)
    validator = BleuValidator(config, None, None, None, workdir)
    assert validator.best_bleu == 30.0  # was -inf: step 4's 25 would have become the best
    assert len(rolled_back(workdir, 4)) == 1 and len(list(run.best.glob("3.damaged-*"))) == 1
    restored_step, restored, restored_params = load_from_directory(run.best)
    assert (restored_step, restored.bleu, best_steps(workdir)) == (3, 30.0, [3])
    for got, want in zip(jax.tree.leaves(restored_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(got, want)
    validator(4, params, metadata)
    validator.close()
    assert best_checkpoint(run) == (3, 30.0)
