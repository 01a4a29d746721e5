"""A run stopped between its checkpoints (an interim checkpoint) and resumed with its length
shortened past that step ends there: that step's evaluation, and its interim checkpoint made the
run's last, which a kill at any point never leaves missing. The records that stand for that step's
work: test_shortened_end_records.py."""

import json
import logging
import shutil
import signal
import subprocess
import sys
import types

import pytest

from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_checkpoint
from tests.training.test_loop import ONE_LAYER, SIGTERM_AFTER_STEP, checkpoint_steps, command, environment, losses

pytestmark = pytest.mark.xdist_group("train-loop")

# train.py (its arguments after argv[2]) killed (SIGKILL) as checkpoint argv[1] changes: as it is
# saved again, or as its new metadata is renamed into place.
KILLED_AS_THE_CHECKPOINT_CHANGES = """
import os, signal, sys
from jaxformer.commands import train
from jaxformer.run.checkpoint import Checkpointer

step = int(sys.argv[1])
real_save, real_replace = Checkpointer.save, os.replace

def killed_saving(checkpointer, at, *args, **kwargs):
    if at == step:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(checkpointer, at, *args, **kwargs)

def killed_renaming(source, target):
    if str(target).endswith(f"/checkpoints/{step}/metadata/metadata"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(source, target)

Checkpointer.save, os.replace = killed_saving, killed_renaming
sys.exit(train.main(sys.argv[2:]))
"""


def run_script(script, *argv):
    return subprocess.run(
        [sys.executable, "-c", script, *argv], env=environment(), capture_output=True, text=True, timeout=600
    )


def read_metadata(workdir, step):
    checkpointer = Checkpointer(workdir / "checkpoints", read_only=True)
    try:
        return checkpointer.read_metadata(step)
    finally:
        checkpointer.close()


def interim(workdir, step):
    return read_metadata(workdir, step).interim


def saved_as_last(workdir, step):
    return read_metadata(workdir, step).saved_as_last


@pytest.mark.slow  # three runs: stopped between checkpoints, then resumed shortened and killed, then again
def test_a_kill_as_a_shortened_run_ends_at_its_interim_checkpoint_loses_no_step(data_dir, tmp_path):
    workdir = tmp_path / "run"
    flags = ("--config.training.log_every_steps=10", *ONE_LAYER)  # steps 31-34: in the interim checkpoint
    argv = command(workdir, data_dir, *flags)[2:]  # after the interpreter and train.py
    stopped = run_script(SIGTERM_AFTER_STEP, "34", *argv)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert checkpoint_steps(workdir) == [20, 34] and interim(workdir, 34)

    shortened = (*argv, "--config.training.num_train_steps=30")
    killed = run_script(KILLED_AS_THE_CHECKPOINT_CHANGES, "34", *shortened)
    assert killed.returncode == -9, killed.stderr[-3000:]  # killed at the worst point, not finished
    assert checkpoint_steps(workdir) == [20, 34]  # the checkpoint of step 34 is still there, whole
    step, metadata, _ = load_checkpoint(workdir, 34)  # it restores, its checksums verified
    assert step == 34 and metadata.interim  # the kill came before its new metadata was in place

    result = subprocess.run(
        command(workdir, data_dir, *flags, "--config.training.num_train_steps=30"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from step 34 of" in result.stderr  # not from 20: no step trained is lost
    assert checkpoint_steps(workdir) == [20, 34] and not interim(workdir, 34)  # now the run's last
    step, metadata, _ = load_checkpoint(workdir, 34)
    assert step == 34 and metadata.train_window is None  # steps 31-34 written as their record, not kept
    assert 34 in losses(workdir, "eval/loss") and max(losses(workdir)) == 34  # its evaluation, its train record
    # The killed process's evaluation of step 34 is complete and measured alike: it stands, not measured again.
    assert "step 34: validation loss" in killed.stderr and "as measured before the stop" in result.stderr
    # Written again after the kill: the killed process's records of step 34 moved aside, each kept once.
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    kinds = [(record["step"], frozenset(record) - {"time"}) for record in records]
    assert len(kinds) == len(set(kinds))
    moved = (workdir / "metrics.rolled_back.jsonl").read_text().splitlines()
    assert {json.loads(line)["step"] for line in moved} == {34}
    assert not [line for line in moved if "eval/loss" in line]  # only its train/ record, written again


@pytest.mark.slow  # two short runs and a third that does nothing, in-process (about 15 s)
def test_a_run_resumed_to_end_at_the_step_of_its_interim_checkpoint_does_that_steps_work(
    data_dir, tmp_path, monkeypatch, caplog
):
    """Stopped after step 3 of 4 (checkpoints every 2), then given num_train_steps=3: the run ends
    there as one shortened past it does (step 3's evaluation and BLEU, its checkpoint made the
    run's last, the warning), not as one that had ended there; the same again redoes nothing."""
    from jaxformer.training import loop
    from jaxformer.training.config_file import apply_overrides
    from tests.training.test_signals import _four_step_config, _signal_after_step

    config = _four_step_config(data_dir, final_choice=False)
    apply_overrides(config, [("training.bleu_every_steps", "4"), ("training.bleu_examples", "8")])  # the last step's
    workdir = tmp_path / "run"
    real_run_due = loop.run_due
    monkeypatch.setattr(loop, "run_due", _signal_after_step(loop, 3))
    assert loop.train_and_evaluate(config, workdir)["stopped_by_signal"] == signal.SIGTERM
    assert checkpoint_steps(workdir) == [2, 3] and interim(workdir, 3)
    monkeypatch.setattr(loop, "run_due", real_run_due)
    config.training.num_train_steps = 3
    with caplog.at_level(logging.INFO):
        last = loop.train_and_evaluate(config, workdir)
    assert (
        "training.num_train_steps=3 ends the run at step 3, already trained: it was shortened to that step"
    ) in caplog.text
    assert last["step"] == 3 and last["shortened_by"] == "training.num_train_steps=3"
    assert last["eval"]["loss"] == losses(workdir, "eval/loss")[3] and 3 in losses(workdir, "eval/bleu")
    assert checkpoint_steps(workdir) == [2, 3] and not interim(workdir, 3)  # now the run's last

    records = (workdir / "metrics.jsonl").read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = loop.train_and_evaluate(config, workdir)
    assert again["step"] == again["first_step"] == 3 and "it was shortened" not in caplog.text
    assert "step 3: validation" not in caplog.text  # nothing measured again, nor said to be reused
    assert (workdir / "metrics.jsonl").read_text() == records and not interim(workdir, 3)


def saved(step, num_train_steps, minutes=0.0, seconds=None, last=None, interim=False):
    """A checkpoint's metadata, as far as where its run ends is read from it (`last`: its saved_as_last mark)."""
    training = {"num_train_steps": num_train_steps, "time_budget_minutes": minutes}
    config = {"training": training}
    return types.SimpleNamespace(step=step, config=config, train_seconds=seconds, saved_as_last=last, interim=interim)


def test_a_checkpoint_is_saved_before_its_runs_end_where_its_length_and_time_budget_went_on():
    from jaxformer.training.resumed_end import heading_past

    assert heading_past(saved(281, 300))  # stopped, or a scheduled checkpoint: a shortened end is that run's
    assert not heading_past(saved(300, 300)) and not heading_past(saved(20, 10))  # its run's end: done there
    assert heading_past(saved(22, 1000, 0.5, 29.9))
    assert not heading_past(saved(22, 1000, 0.5, 30.0))  # its time budget ended the run there
    assert heading_past(saved(22, 1000, 0.5, None))  # from before train_seconds was kept: never spent
    before_budgets = {"training": {"num_train_steps": 9}}
    assert heading_past(types.SimpleNamespace(step=5, config=before_budgets, train_seconds=1.0, saved_as_last=None))
    assert not heading_past(saved(281, 300, last=True))  # marked as its run's last: heading nowhere past it


def test_a_checkpoints_mark_says_whether_a_resume_ending_there_does_its_steps_work():
    """Saved on the schedule once the time budget had run out, before the check that would have
    ended the run there, by a run then killed: marked, a resume (its budget spent) ends there with
    that step's work, not shortened; unmarked (older checkpoints), it is inferred as before, taken
    as its run's end. Marked as its run's last, nothing is to do again."""
    from jaxformer.training.experiment import default_config
    from jaxformer.training.resumed_end import ResumedEnd, heading_past, resumed_end, saved_unfinished

    training = default_config().training
    training.update(num_train_steps=1000, time_budget_minutes=0.5)
    no_budget_schedule = types.SimpleNamespace(active=False)

    def end(metadata):
        return resumed_end(training, metadata, metadata.step, True, no_budget_schedule, None, None)

    spent_before_the_check = saved(22, 1000, 0.5, 30.5, last=False)
    assert saved_unfinished(spent_before_the_check) and not heading_past(spent_before_the_check)
    assert end(spent_before_the_check) == ResumedEnd(shortened=None, unfinished=True)
    assert end(saved(22, 1000, 0.5, 30.5, last=True)) == ResumedEnd(shortened=None, unfinished=False)
    assert end(saved(22, 1000, 0.5, 30.5)) == ResumedEnd(shortened=None, unfinished=False)  # unmarked: as before
    # Unmarked, the old inference: interim, or saved before the end its length and budget gave.
    inferred = [saved(22, 1000, 0.5, 30.5, interim=True), saved(22, 1000, 0.5, 29.9), saved(22, 23)]
    assert all(saved_unfinished(metadata) for metadata in inferred)
    assert not any(saved_unfinished(types.SimpleNamespace(**{**vars(m), "saved_as_last": True})) for m in inferred)
    assert not saved_unfinished(saved(23, 23)) and saved_unfinished(saved(23, 23, last=False))
    assert end(saved(22, 1000, 0.5, 29.9, last=True)) == ResumedEnd(shortened=None, unfinished=False)
    assert resumed_end(training, None, 0, False, no_budget_schedule, None, None) == ResumedEnd(None, False)  # new run


def test_a_spent_time_budget_shortens_only_a_run_that_was_heading_past_its_step(caplog):
    from jaxformer.training.experiment import default_config
    from jaxformer.training.resumed_end import shortened_past

    training = default_config().training
    training.update(num_train_steps=1000, time_budget_minutes=0.2)
    no_budget_schedule = types.SimpleNamespace(active=False)  # no rate to say
    with caplog.at_level(logging.WARNING):
        assert shortened_past(training, 22, False, True, no_budget_schedule, None, None) is None  # it ended there
        assert not caplog.messages
        shortened = shortened_past(training, 22, True, True, no_budget_schedule, None, None)
    assert shortened == "training.time_budget_minutes=0.2"
    assert caplog.messages == [f"{shortened} ends the run at step 22, already trained: it was shortened past that step"]
    # Under the budget schedule its rate is said against the floor; a floor of 0 is no multiple, and
    # the rate above it is not the floor.
    budget_schedule = types.SimpleNamespace(active=True, steps=lambda state: 400.0)
    state = types.SimpleNamespace(opt_state=None)
    for floor, above in ((0.01, "3.0x its floor 0.01"), (0.0, "above its floor 0")):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            shortened_past(
                training,
                22,
                True,
                True,
                budget_schedule,
                state,
                lambda count, _, floor=floor: floor if count > 22 else 0.03,
            )
        assert caplog.messages == [
            f"{shortened} ends the run at step 22, already trained: it was shortened past that step, so the budget "
            f"schedule ended above its floor: the rate 0.03 is {above} (its end was step 400)"
        ]


def test_a_finished_run_shortened_past_its_step_and_run_again_is_not_shortened_again(caplog):
    """Killed after the scheduled checkpoint of step 20 (on its way to 40), resumed with
    num_train_steps=10: shortened past it, that checkpoint becomes the run's last with that length.
    The same command again finds a finished run, as an unshortened one does: nothing said shortened."""
    from jaxformer.training.experiment import default_config
    from jaxformer.training.resumed_end import ResumedEnd, resumed_end

    training = default_config().training
    training.update(num_train_steps=10, time_budget_minutes=0.0)
    no_budget_schedule = types.SimpleNamespace(active=False)  # no rate to say

    def end(metadata):
        return resumed_end(training, metadata, metadata.step, False, no_budget_schedule, None, None)

    with caplog.at_level(logging.WARNING):
        assert end(saved(20, 40, last=False)) == ResumedEnd("training.num_train_steps=10", unfinished=True)
        assert end(saved(20, 40)) == ResumedEnd("training.num_train_steps=10", unfinished=True)  # unmarked alike
    assert caplog.messages == 2 * [
        "training.num_train_steps=10 ends the run at step 20, already trained: it was shortened past that step"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        for made_last in (saved(20, 10, last=True), saved(20, 10)):  # the checkpoint made the run's last, as before
            assert end(made_last) == ResumedEnd(shortened=None, unfinished=False)
        assert end(saved(300, 300, last=True)) == ResumedEnd(None, False)  # finished at 300, given 10 now: finished
    assert not caplog.messages


@pytest.mark.slow  # a short run stopped after step 1, then its end, in-process (about 15 s)
def test_a_run_stopped_once_its_time_budget_ran_out_before_a_check_ends_there_unshortened(
    data_dir, tmp_path, monkeypatch, caplog
):
    """The budget is checked every 2 steps here: a SIGTERM after step 1, once the budget ran out,
    saves an interim checkpoint. The same command ends there with that step's work, as the run
    would have at its next check, and says nothing was shortened: no setting changed."""
    from jaxformer.training import loop
    from jaxformer.training.config_file import apply_overrides
    from tests.training.test_signals import _four_step_config, _signal_after_step, _time_budget_spent_at_step_1

    config = _four_step_config(data_dir, final_choice=False)
    _time_budget_spent_at_step_1(config)
    apply_overrides(config, [("training.log_every_steps", "2")])  # the budget is read at steps 2 and 4
    workdir = tmp_path / "run"
    real_run_due = loop.run_due
    monkeypatch.setattr(loop, "run_due", _signal_after_step(loop, 1))
    assert loop.train_and_evaluate(config, workdir)["stopped_by_signal"] == signal.SIGTERM
    assert checkpoint_steps(workdir) == [1] and interim(workdir, 1)
    monkeypatch.setattr(loop, "run_due", real_run_due)
    with caplog.at_level(logging.INFO):
        last = loop.train_and_evaluate(config, workdir)
    assert "time budget of 1e-09 minutes already spent at step 1" in caplog.text
    assert "it was shortened" not in caplog.text and "shortened_by" not in last
    assert last["step"] == 1 and last["ended_by"] == "time budget" and 1 in losses(workdir, "eval/loss")
    assert not interim(workdir, 1)  # now the run's last


@pytest.mark.slow  # a short run, then its resume, then the same again, in-process (about 15 s)
def test_a_run_killed_after_a_checkpoint_saved_once_its_budget_ran_out_before_a_check_ends_there_with_its_work(
    data_dir, tmp_path, caplog
):
    """The budget is read at step 3 here (every 3 steps), spent from step 1: step 2's scheduled
    checkpoint is saved once the budget had run out, before the check that ends the run at step 3.
    Killed right after that save, the same command ends at step 2 as a run stopped there by a signal
    does (its budget is spent: it trains no more), with the step's evaluation, the checkpoint made
    the run's last; the same again redoes nothing."""
    from jaxformer.training import loop
    from jaxformer.training.config_file import apply_overrides
    from tests.training.test_signals import _four_step_config, _time_budget_spent_at_step_1

    config = _four_step_config(data_dir, final_choice=False)
    _time_budget_spent_at_step_1(config)
    # No evaluation at step 2, which would read the budget before its checkpoint (periodic.run_due).
    apply_overrides(config, [("training.log_every_steps", "3"), ("training.eval_every_steps", "3")])
    workdir = tmp_path / "run"
    assert loop.train_and_evaluate(config, workdir)["step"] == 3  # the check at step 3 ended it
    assert checkpoint_steps(workdir) == [2, 3] and [saved_as_last(workdir, step) for step in (2, 3)] == [False, True]
    shutil.rmtree(workdir / "checkpoints" / "3")  # as if killed right after step 2's checkpoint
    with caplog.at_level(logging.INFO):
        last = loop.train_and_evaluate(config, workdir)
    assert "resumed from step 2 of" in caplog.text
    assert "time budget of 1e-09 minutes already spent at step 2" in caplog.text
    assert "it was shortened" not in caplog.text and "shortened_by" not in last  # its own budget ended it
    assert last["step"] == 2 and last["ended_by"] == "time budget"
    assert last["eval"]["loss"] == losses(workdir, "eval/loss")[2] and max(losses(workdir, "eval/loss")) == 2
    assert checkpoint_steps(workdir) == [2] and saved_as_last(workdir, 2)  # now the run's last

    records = (workdir / "metrics.jsonl").read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = loop.train_and_evaluate(config, workdir)
    assert again["step"] == again["first_step"] == 2 and "step 2: validation" not in caplog.text
    assert (workdir / "metrics.jsonl").read_text() == records
