"""Spending a training budget: the "budget" schedule's shape in a real run, exact resume in the
middle of it, a wall-clock budget that ends the run (and is carried across a resume), and the
automatic final choice among the latest, best and averaged parameters and their moving average
(checked against translating each candidate through Translator and scoring it with sacreBLEU). The
pace estimate and the schedule's end, with a fake clock: test_budget_schedule_end.py."""

import dataclasses
import json
import logging
import pathlib
import shutil
import types

import jax
import numpy as np
import optax
import pytest
import sacrebleu

from jaxformer.data.pipeline import record_text
from jaxformer.data.sources import get_builder, load_split
from jaxformer.decoding.translator import Translator
from jaxformer.run.averaging import average_last
from jaxformer.run.loading import load_checkpoint, load_from_directory
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.optimizer import budget_rate
from jaxformer.training.validation_bleu import decode_settings
from tests.training.test_budget_records import not_json
from tests.training.test_loop import ONE_LAYER, ROOT, losses, train

pytestmark = pytest.mark.xdist_group("budget")

D_MODEL, WARMUP = 32, 5  # the tiny preset's width; a warmup short enough to see the decay
SCHEDULE = (
    *ONE_LAYER,  # the schedule, resume and final choice hold at any depth; each program compiles faster
    "--config.optimizer.schedule=budget",
    f"--config.optimizer.warmup_steps={WARMUP}",
    "--config.optimizer.learning_rate_scale=1.0",
)


CHOICE = (
    "--config.training.final_choice=True",
    "--config.training.average_last=2",
    "--config.training.bleu_every_steps=20",
    "--config.training.bleu_examples=16",
    "--config.training.bleu_method=greedy",  # during training; the final choice searches with `decoding`
    "--config.decoding.beam_size=2",
    "--config.decoding.max_extra_length=8",
    # transformers' |Y|^alpha, as a run fine-tuned from a --from_hf import has it: the BLEU during
    # training, the final choice and its alphas are searched with it, and final/ is translated with it.
    "--config.decoding.length_penalty=transformers",
    # Then these length penalties besides decoding.alpha (0.6) on the chosen parameters; 0.6 twice
    # is scored once.
    "--config.training.final_alphas=(0.0, 0.6, 3.0)",
    # A moving average of the parameters: checkpointed, resumed, and the final choice's fourth candidate.
    "--config.optimizer.ema_decay=0.9",
    # AdamW's decay, under the budget schedule: its (leafless) state is checkpointed and resumed too.
    "--config.optimizer.weight_decay=0.01",
)


def peak():
    return D_MODEL**-0.5 * WARMUP**-0.5  # learning_rate_scale 1: the rsqrt schedule's peak


def last_metrics(workdir):
    return json.loads((pathlib.Path(workdir) / "last_metrics.json").read_text())


def ema_in_checkpoint(workdir, step):
    """The parameters' moving average as a checkpoint's `state` holds it, read by orbax alone."""
    import orbax.checkpoint as ocp

    path = pathlib.Path(workdir) / "checkpoints" / str(step) / "state"
    checkpointer = ocp.PyTreeCheckpointer()
    as_numpy = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), checkpointer.metadata(path).item_metadata.tree
    )
    state = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
    checkpointer.close()
    average = optax.tree_utils.tree_get(state, "ema_params")  # KeyError if the state held two
    assert average is not None, "a moving average in the optimizer state"
    return average


@pytest.fixture(scope="module")
def scheduled_run(tmp_path_factory, data_dir):
    """40 steps (checkpoints at 20 and 40) with the budget schedule and the final choice; its stderr."""
    workdir = tmp_path_factory.mktemp("budget_schedule")
    result = train(workdir, data_dir, *SCHEDULE, "--config.optimizer.decay_floor=0.1", *CHOICE)
    return types.SimpleNamespace(workdir=workdir, stderr=result.stderr)


def test_the_rate_warms_up_then_decays_to_its_floor_at_num_train_steps(scheduled_run):
    rates = losses(scheduled_run.workdir, "train/learning_rate")
    assert sorted(rates) == list(range(1, 41))
    expected = [float(budget_rate(step - 1, 40, peak(), WARMUP, 0.1)) for step in range(1, 41)]
    np.testing.assert_allclose([rates[step] for step in range(1, 41)], expected, rtol=1e-5)
    np.testing.assert_allclose(rates[WARMUP], peak(), rtol=1e-5)
    np.testing.assert_allclose(rates[40], 0.1 * peak(), rtol=1e-5)


def test_resume_in_the_middle_of_the_schedule_is_exact(scheduled_run, data_dir, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(scheduled_run.workdir, resumed)
    shutil.rmtree(resumed / "checkpoints" / "40")  # as if stopped at step 20
    shutil.rmtree(resumed / "final")
    result = train(resumed, data_dir, *SCHEDULE, "--config.optimizer.decay_floor=0.1", *CHOICE)
    assert "resumed from step 20" in result.stderr
    straight, again = losses(scheduled_run.workdir), losses(resumed)  # steps 21-40 of `resumed`: logged last
    assert [again[s] for s in range(21, 41)] == [straight[s] for s in range(21, 41)]  # bitwise
    assert losses(resumed, "train/learning_rate")[40] == losses(scheduled_run.workdir, "train/learning_rate")[40]
    assert (
        load_checkpoint(resumed, "final")[1].chosen_from
        == load_checkpoint(scheduled_run.workdir, "final")[1].chosen_from
    )
    # The moving average is restored with the optimizer state and goes on as if never stopped.
    jax.tree.map(
        np.testing.assert_array_equal, ema_in_checkpoint(resumed, 40), ema_in_checkpoint(scheduled_run.workdir, 40)
    )
    assert last_metrics(resumed)["final"]["ema/bleu"] == last_metrics(scheduled_run.workdir)["final"]["ema/bleu"]


@pytest.mark.slow  # three runs; the budget's arithmetic is tested with a fake clock below
def test_a_time_budget_ends_the_run_and_carries_over_a_resume(data_dir, tmp_path):
    workdir = tmp_path / "timed"
    # A budget far beyond 30 steps however slow the machine: the run ends by its steps. The tiny
    # config logs (and checks the budget at) every step: step 1's has no pace yet, so no end_step.
    train(
        workdir, data_dir, *SCHEDULE, "--config.training.time_budget_minutes=10", "--config.training.num_train_steps=30"
    )
    records = [json.loads(line, parse_constant=not_json) for line in (workdir / "metrics.jsonl").open()]
    ends = {record["step"]: record.get("budget/end_step") for record in records if "budget/seconds" in record}
    assert sorted(ends) == list(range(1, 31)) and ends[1] is None
    assert all(type(ends[step]) is float and step <= ends[step] <= 30 for step in range(2, 31))
    first = last_metrics(workdir)
    assert first["step"] == 30 and "ended_by" not in first and 0 < first["train_seconds"] < 600
    timed = (*SCHEDULE, "--config.training.log_every_steps=10")
    # Resumed with a budget that leaves 6 more seconds (the run's budget and length may change on resume).
    budget_seconds = first["train_seconds"] + 6.0
    timed = (*timed, f"--config.training.time_budget_minutes={budget_seconds / 60!r}")
    forever = "--config.training.num_train_steps=1000000"
    result = train(workdir, data_dir, *timed, forever)
    summary = last_metrics(workdir)
    assert "resumed from step 30" in result.stderr
    # The end, capped at 30 by the old length, moves to the new one at once: no step past 30 trains at rate 0.
    assert (
        "budget schedule: its end moves from step 30, estimated for training.num_train_steps=30 and "
        "training.time_budget_minutes=10, to 1000000 until this run's pace re-estimates it"
    ) in result.stderr
    # The first step logged after the resume trained before this run's first check of its pace: at the
    # end the resume set, not the saved 30. Later ones may meet the floor where a noisy machine's pace
    # puts the estimated end before the budget is spent (the next check moves it on).
    rates = losses(workdir, "train/learning_rate")
    assert rates[min(step for step in rates if step > 30)] > 0
    assert summary["ended_by"] == "time budget" and 30 < summary["step"] < 1_000_000
    # The earlier 30 steps' seconds count; the run stops at the first check past the budget.
    assert budget_seconds <= summary["train_seconds"] < budget_seconds + 30
    seconds = losses(workdir, "budget/seconds")
    assert min(seconds[s] for s in seconds if s > 30) >= first["train_seconds"]  # counted on from the checkpoint
    assert summary["step"] in [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert summary["step"] in losses(workdir, "eval/loss")  # the last step's evaluation ran
    last_step = summary["step"]
    assert losses(workdir, "budget/end_step")[last_step] == last_step + 1  # spent: the schedule ends now
    again = train(workdir, data_dir, *timed, forever)  # the budget is spent: nothing more to train
    assert f"time budget of {budget_seconds / 60:g} minutes already spent" in again.stderr
    assert last_metrics(workdir)["step"] == summary["step"]


@pytest.mark.slow  # a resumed run and its final choice (about 8 s): the default suite is near its limit
@pytest.mark.parametrize("length, shortened", [(10, "past"), (20, "to")])
def test_a_run_resumed_past_a_shortened_length_ends_there_and_says_its_rate_is_above_the_floor(
    scheduled_run, data_dir, tmp_path, length, shortened
):
    """Killed after the scheduled checkpoint of step 20 (on its way to 40) and resumed with the
    length at or below 20: the run ends at 20 with the work of a run's last step, the checkpoint
    made the run's last; the same command again redoes nothing and says the run finished, not
    shortened again."""
    workdir = tmp_path / "shortened"
    shutil.copytree(scheduled_run.workdir, workdir)
    shutil.rmtree(workdir / "checkpoints" / "40")  # as if killed after step 20
    shutil.rmtree(workdir / "final")
    flags = (*SCHEDULE, "--config.optimizer.decay_floor=0.1", *CHOICE, f"--config.training.num_train_steps={length}")
    result = train(workdir, data_dir, *flags)
    rate, floor = float(budget_rate(19, 40, peak(), WARMUP, 0.1)), 0.1 * peak()  # step 20's, on its way to 40
    assert (
        f"W training.num_train_steps={length} ends the run at step 20, already trained: it was shortened {shortened} "
        f"that step, so the budget schedule ended above its floor: the rate {rate:.3g} is {rate / floor:.1f}x its "
        f"floor {floor:.3g} (its end was step 40)"
    ) in result.stderr
    assert (
        f"run finished: 0 steps: training.num_train_steps={length}, shortened on resume, ends the run at step 20, "
        "already trained ("
    ) in result.stderr
    assert last_metrics(workdir)["shortened_by"] == f"training.num_train_steps={length}"
    assert "final choice at step 20" in result.stderr
    # The work of a run's last step: the evaluation and BLEU step 20 recorded stand for it.
    assert "step 20: validation loss" in result.stderr and "step 20: validation BLEU" in result.stderr
    assert max(losses(workdir, "eval/loss")) == max(losses(workdir, "eval/bleu")) == max(losses(workdir)) == 20
    assert load_checkpoint(workdir, 20)[1].config["training"]["num_train_steps"] == length  # the run's last
    records = (workdir / "metrics.jsonl").read_text()
    again = train(workdir, data_dir, *flags)
    assert "it was shortened" not in again.stderr and "step 20: validation" not in again.stderr
    assert f"run finished: 0 steps (20 -> 20 of {length}) in " in again.stderr
    assert (workdir / "metrics.jsonl").read_text() == records


def test_the_run_saves_the_candidate_with_the_highest_validation_bleu(scheduled_run, data_dir):
    workdir, stderr = scheduled_run.workdir, scheduled_run.stderr
    summary = json.loads((workdir / "last_metrics.json").read_text())["final"]
    assert {"latest/bleu", "averaged/bleu", "ema/bleu"} <= set(summary)
    step, metadata, _ = load_checkpoint(workdir, "final")
    assert step == 40 and metadata.chosen_from == summary["chosen"] and metadata.bleu == summary["bleu"]
    assert summary["bleu"] == max(value for key, value in summary.items() if key.endswith("/bleu"))
    assert "final choice at step 40" in stderr
    assert (
        f"final choice: {summary['chosen']}, alpha {metadata.alpha:g} (validation BLEU {summary['bleu']:.2f})" in stderr
    )
    assert f"--workdir {workdir.absolute()} --checkpoint final" in stderr  # its translate command

    # Each candidate scored independently: translated by a Translator loaded from the workdir.
    config = with_absolute_paths(_config(data_dir))
    validation = load_split(get_builder(config.data), "validation", ("en", "de"))
    records = validation.__getitems__(list(range(config.data.max_eval_examples)))
    sources = [record_text(record, "en") for record in records]
    references = [record_text(record, "de") for record in records]
    average_last(workdir, 2)  # the same mean, written to averaged/ for the Translator to load
    translator = Translator.from_workdir(workdir, "final", decode_settings(config), batch_size=64)

    def bleu(checkpoint, translator=translator, count=None):
        params = load_checkpoint(workdir, checkpoint)[2]
        hypotheses = translator.with_params(params).translate(sources[:count])
        return sacrebleu.corpus_bleu(hypotheses, [references[:count]]).score

    for name in ("latest", "averaged", "best"):
        if f"{name}/bleu" in summary:
            assert bleu(name) == pytest.approx(summary[f"{name}/bleu"], abs=1e-6), name
    # The moving average, as step 40's checkpoint holds it, differs from the latest parameters.
    ema = ema_in_checkpoint(workdir, 40)
    latest = load_checkpoint(workdir, "latest")[2]
    assert jax.tree.structure(ema) == jax.tree.structure(latest)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(latest), strict=True))
    ema_bleu = sacrebleu.corpus_bleu(translator.with_params(ema).translate(sources), [references]).score
    assert ema_bleu == pytest.approx(summary["ema/bleu"], abs=1e-6)

    # Then the chosen parameters with each length penalty: the highest BLEU's alpha is kept (the
    # config's 0.6 on a tie, then the first listed), and final/ translates to that BLEU with it.
    by_alpha = {alpha: summary[f"alpha_{alpha:g}/bleu"] for alpha in (0.6, 0.0, 3.0)}
    assert len([key for key in summary if key.startswith("alpha_") and key.endswith("/bleu")]) == 3
    assert summary[f"alpha_{0.6:g}/bleu"] == summary[f"{summary['chosen']}/bleu"]
    assert metadata.alpha == summary["alpha"] == max(by_alpha, key=by_alpha.get)
    assert metadata.config["decoding"]["length_penalty"] == "transformers"  # the form that alpha was chosen with
    assert summary["bleu"] == by_alpha[metadata.alpha]
    for alpha in (0.0, 3.0):
        with_alpha = dataclasses.replace(decode_settings(config), alpha=alpha)
        searched = Translator.from_workdir(workdir, "final", with_alpha, batch_size=64)
        assert bleu("final", searched) == pytest.approx(by_alpha[alpha], abs=1e-6), alpha

    # Validation BLEU during training searched greedily: step 20's logged BLEU is greedy's.
    greedy = Translator.from_workdir(workdir, 20, dataclasses.replace(decode_settings(config), method="greedy"))
    assert bleu(20, greedy, 16) == pytest.approx(losses(workdir, "eval/bleu")[20], abs=1e-6)


# slow: translate and evaluate on a real run's final/ (about 10 s: its searches compiled again); covered in
# the default suite by tests/decoding/test_checkpoint_alpha.py (test_a_command_on_final_reads_its_chosen_search_once,
# test_from_workdir_searches_final_with_the_length_penalty_the_alpha_was_chosen_with) and
# tests/decoding/test_final_search_defaults.py (the warning of another search than the choice's).
@pytest.mark.slow
def test_translate_and_evaluate_use_the_alpha_the_run_chose_unless_told(scheduled_run, tmp_path, capsys, caplog):
    from jaxformer.commands import decoding_flags, evaluate, translate

    workdir = scheduled_run.workdir
    chosen = load_checkpoint(workdir, "final", params=False)[1].alpha
    assert chosen is not None and chosen == last_metrics(workdir)["final"]["alpha"]

    def alpha(*flags):
        args = translate.build_parser().parse_args(["--workdir", str(workdir), *flags])
        return decoding_flags.decode_settings_from_flags(args, 8).alpha

    assert alpha("--checkpoint", "final") == chosen
    assert alpha("--checkpoint", "final", "--alpha", "0.25") == 0.25
    assert alpha("--checkpoint", "latest") == alpha("--checkpoint", "best") == 0.6  # no choice made there

    def form(*flags):
        args = translate.build_parser().parse_args(["--workdir", str(workdir), *flags])
        return decoding_flags.decode_settings_from_flags(args, 8).length_penalty

    # The length penalty's form the alpha was chosen with goes with it, unless --length_penalty is given.
    assert form("--checkpoint", "final") == form("--checkpoint", "final", "--alpha", "0.25") == "transformers"
    assert form("--checkpoint", "latest") == form("--checkpoint", "best") == "gnmt"
    caplog.clear()
    assert form("--checkpoint", "final", "--length_penalty", "gnmt", "--beam_size", "2") == "gnmt"
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert warnings == [  # another search than the choice's (info lines depend on the levels other tests left)
        f"alpha {chosen:g} was chosen for another search than this one (length_penalty transformers -> gnmt): "
        "give --alpha to choose it yourself",
    ]

    # Through the command: evaluate's JSON names the alpha its translations were searched with.
    scores = tmp_path / "scores.json"
    flags = ["--workdir", str(workdir), "--checkpoint", "final", "--split", "validation", "--max_examples", "64"]
    flags += ["--beam_size", "2", "--max_extra_length", "8", "--json", str(scores)]
    capsys.readouterr()
    assert evaluate.main(flags) == 0
    logged = capsys.readouterr().err
    assert f"I length penalty alpha {chosen:g}: chosen on validation by the run" in logged
    assert "I length penalty transformers: the run's final choice was made with it" in logged
    assert "another search" not in logged  # the search the choice was made with
    # Another search than the choice's: the alpha is still the run's, with a warning naming the difference.
    beam = load_checkpoint(workdir, "final", params=False)[1].config["decoding"]["beam_size"]
    assert alpha("--checkpoint", "final", "--beam_size", str(beam + 1), "--max_extra_length", "8") == chosen
    assert (
        f"W alpha {chosen:g} was chosen for another search than this one (beam_size {beam} -> {beam + 1}): "
        "give --alpha to choose it yourself"
    ) in capsys.readouterr().err
    greedy = ["--workdir", str(workdir), "--checkpoint", "final", "--split", "validation", "--max_examples", "8"]
    assert evaluate.main([*greedy, "--method", "greedy", "--max_extra_length", "8"]) == 0
    assert "length penalty" not in capsys.readouterr().err  # greedy search reads no alpha
    written = json.loads(scores.read_text())
    assert written["length_penalty"] == "transformers"
    assert written["alpha"] == chosen and written["bleu"] == pytest.approx(
        last_metrics(workdir)["final"]["bleu"], abs=1e-6
    )


def _config(data_dir):
    from jaxformer.training.config_file import load_config

    config = load_config(str(ROOT / "jaxformer" / "configs" / "tiny.py"))
    config.data.data_dir = str(data_dir)
    config.decoding.beam_size, config.decoding.max_extra_length = 2, 8
    config.decoding.length_penalty = "transformers"
    return config


@pytest.mark.slow  # a run continued past its end: 20 steps more and a second final choice
def test_a_run_continued_past_its_end_keeps_its_earlier_final_choice(scheduled_run, data_dir, tmp_path):
    workdir = tmp_path / "continued"
    shutil.copytree(scheduled_run.workdir, workdir)
    before = load_checkpoint(workdir, "final", params=False)[1]
    result = train(
        workdir,
        data_dir,
        *SCHEDULE,
        "--config.optimizer.decay_floor=0.1",
        *CHOICE,
        "--config.training.num_train_steps=60",
    )
    assert "final choice: the choices made at step(s) 40 stay in" in result.stderr
    assert sorted(int(path.name) for path in (workdir / "final").iterdir() if path.name.isdigit()) == [40, 60]
    assert load_checkpoint(workdir, "final", params=False)[0] == 60  # --checkpoint final: the newest
    assert load_from_directory(workdir / "final", 40, params=False)[1] == before  # the earlier one, as it was


@pytest.mark.slow  # the final choice made again
def test_a_run_killed_during_its_final_choice_ends_with_the_figures_of_one_never_stopped(
    scheduled_run, data_dir, tmp_path
):
    """Killed (kill -9) while its final choice was saved: the same command trains no step, makes
    the choice, and writes the last figures (and summary) of a run never stopped."""
    workdir = tmp_path / "killed"
    shutil.copytree(scheduled_run.workdir, workdir)
    (workdir / "last_metrics.json").unlink()
    (workdir / "final" / "40").rename(workdir / "final" / "40.orbax-checkpoint-tmp-1700000000000000")
    result = train(workdir, data_dir, *SCHEDULE, "--config.optimizer.decay_floor=0.1", *CHOICE)
    assert "resumed from step 40" in result.stderr
    straight, resumed = last_metrics(scheduled_run.workdir), last_metrics(workdir)
    assert (
        sorted(resumed) == sorted(straight) == ["bleu", "eval", "final", "first_step", "step", "train", "train_seconds"]
    )
    assert [resumed[key] for key in ("eval", "bleu", "train", "final", "step")] == [
        straight[key] for key in ("eval", "bleu", "train", "final", "step")
    ]
    assert f"validation: loss {straight['eval']['loss']:.4f}, perplexity " in result.stderr
