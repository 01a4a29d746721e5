"""The summary jaxformer-train logs at the end of a run: steps, time, best validation BLEU, where the
checkpoints are, and a translate command that jaxformer-translate accepts; checked against
metrics.jsonl and the checkpoint folders on disk."""

import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

from jaxformer.commands import translate
from jaxformer.commands.run_summary import format_duration, run_summary
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.training.config_file import load_config
from tests.conftest import make_workdir
from tests.training.test_loop import environment

pytestmark = pytest.mark.xdist_group("train-summary")

ROOT = pathlib.Path(__file__).parents[2]


def train(workdir, data_dir, *overrides):
    """Runs `train.py --config tiny` (the config by name); returns (summary lines, wall seconds)."""
    command = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(workdir)]
    command += [f"--config.data.data_dir={data_dir}", *overrides]
    start = time.perf_counter()
    result = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-4000:]
    # stderr is a pipe here, as in a redirected log: no progress bar redraws, its figures as log lines
    assert "\r" not in result.stderr and re.search(r" I step \d+: training loss \d+\.\d{4}, ", result.stderr)
    lines = result.stderr.splitlines()
    first = next(index for index, line in enumerate(lines) if " I run finished: " in line)
    return [lines[first].split(" I ", 1)[1]] + [line.strip() for line in lines[first + 1 :]], seconds


def numbered_folders(folder):
    return sorted(int(path.name) for path in pathlib.Path(folder).iterdir() if path.name.isdigit())


def field(lines, prefix):
    (line,) = [line for line in lines if line.startswith(prefix)]
    return line[len(prefix) :]


@pytest.mark.slow  # two runs; the summary's parts are checked on saved workdirs below
def test_summary_of_a_run_and_of_its_resumption(tmp_path, data_dir):
    workdir = tmp_path / "run"
    overrides = [
        "--config.training.num_train_steps=6",
        "--config.training.eval_every_steps=3",
        "--config.training.checkpoint_every_steps=3",
        "--config.training.bleu_every_steps=3",
        "--config.training.bleu_examples=4",
        "--config.decoding.method=greedy",  # compiles faster than beam search
    ]
    lines, seconds = train(workdir, data_dir, *overrides)

    took = re.fullmatch(r"run finished: 6 steps \(0 -> 6 of 6\) in ([0-9.]+) s", lines[0])
    assert took and 0 < float(took.group(1)) <= seconds, lines[0]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    bleu = [(record["eval/bleu"], record["step"]) for record in records if "eval/bleu" in record]
    assert [step for _, step in bleu] == [3, 6]
    best_bleu = max(score for score, _ in bleu)
    best_step = min(step for score, step in bleu if score == best_bleu)  # only a strictly better BLEU replaces it
    assert field(lines, "best validation BLEU: ") == f"{best_bleu:.2f} at step {best_step}"
    last_eval = [record for record in records if "eval/loss" in record][-1]
    assert last_eval["step"] == 6
    assert field(lines, "validation: ") == (
        f"loss {last_eval['eval/loss']:.4f}, perplexity {last_eval['eval/perplexity']:.2f}"
    )
    assert numbered_folders(workdir / "checkpoints") == [3, 6] and numbered_folders(workdir / "best") == [best_step]
    assert field(lines, "checkpoints: ") == (
        f"latest {workdir / 'checkpoints'} (steps 3, 6); best {workdir / 'best'} (step {best_step})"
    )

    command = field(lines, "translate: ")
    assert command.endswith(" < input.en > output.de")
    program, *flags = command.removesuffix(" < input.en > output.de").split()
    assert program == "jaxformer-translate"
    parsed = translate.build_parser().parse_args(flags)
    assert (pathlib.Path(parsed.workdir), parsed.checkpoint) == (workdir, "best")

    # Resumed for two more steps without BLEU: the best checkpoint of the first run is still the one named.
    lines, _ = train(workdir, data_dir, "--config.training.num_train_steps=8")
    assert lines[0].startswith("run finished: 2 steps (6 -> 8 of 8) in ")
    assert field(lines, "best validation BLEU: ") == f"{best_bleu:.2f} at step {best_step}"
    assert numbered_folders(workdir / "checkpoints") == [3, 6, 8]


def save(folder, params, metadata):
    checkpointer = Checkpointer(folder, keep=None)
    checkpointer.save_params(metadata.step, params, metadata)
    checkpointer.close()


def test_a_run_stopped_between_evaluations_names_the_step_of_its_validation_figures(tmp_path):
    """Stopped by SIGTERM at step 36 after its evaluation at step 20, a run's summary said
    "validation: loss 2.1230, perplexity 8.36" under "run stopped by SIGTERM: 36 steps", as if
    measured at step 36."""
    workdir, _, _ = make_workdir(tmp_path / "run", steps=(20, 36))
    config = load_config("tiny")
    figures = {"loss": 2.123, "perplexity": 8.356, "accuracy": 0.37}
    last = {"step": 36, "first_step": 0, "stopped_by_signal": 15, "eval": figures, "eval_step": 20}
    lines = run_summary(config, workdir, last, seconds=1.0)
    assert lines[0].startswith("run stopped by SIGTERM: 36 steps (0 -> 36 of 40)")
    assert "validation at step 20: loss 2.1230, perplexity 8.36" in lines, lines
    for evaluated_at_the_end in (
        {**last, "eval_step": 36},
        {key: value for key, value in last.items() if key != "eval_step"},
    ):
        assert "validation: loss 2.1230, perplexity 8.36" in run_summary(config, workdir, evaluated_at_the_end, 1.0)


def test_summary_without_bleu_or_best_checkpoint(tmp_path, caplog):
    """No BLEU measured, a run stopped by SIGTERM, checkpoints but no best/: the translate command
    uses the latest checkpoint (jaxformer-translate's default); then a final choice the run trained past."""
    workdir, _, _ = make_workdir(tmp_path / "run with space", steps=(5, 10))
    config = load_config("tiny")
    config.data.target_language = "fr"
    last = {"step": 10, "first_step": 5, "stopped_by_signal": 15, "train": {"loss": 3.0}}
    lines = run_summary(config, workdir, last, seconds=125.0)
    assert lines[0] == "run stopped by SIGTERM: 5 steps (5 -> 10 of 40) in 2 min 05 s; run the same command to resume"
    assert "validation BLEU: not measured (set training.bleu_every_steps to measure it)" in lines
    assert not any(line.startswith("validation:") for line in lines)
    assert field(lines, "checkpoints: ") == f"latest {workdir / 'checkpoints'} (steps 5, 10)"
    assert field(lines, "translate: ") == f"jaxformer-translate --workdir '{workdir}' < input.en > output.fr"
    assert field(lines, "metrics: ").endswith(f"tensorboard --logdir '{workdir / 'tensorboard'}'")
    for architecture, command in (
        ("decoder_only", f"generate: jaxformer-generate --workdir '{workdir}' < prompts.fr"),
        ("encoder_only", f"start a translator's encoder: '--config.training.init_encoder_from={workdir}'"),
    ):
        config.model.architecture = architecture
        assert run_summary(config, workdir, last, seconds=1.0)[-1] == command  # pasted into a shell, one argument
    config.model.architecture = "encoder_decoder"

    # Resumed with training.final_choice=False past a final choice of step 5: the summary suggested
    # '--checkpoint final', which translate then warns is stale. It names the choice's step and that the
    # run trained past it, and suggests what translate reads without that warning: best/, else the latest.
    _, metadata, params = load_checkpoint(workdir, 5)
    save(RunDirectory(workdir).final, params, metadata)
    lines = run_summary(config, workdir, last, seconds=1.0)
    assert field(lines, "checkpoints: ").endswith(
        f"final {workdir / 'final'} (step 5; the run trained past it, to step 10)"
    )
    assert field(lines, "translate: ") == f"jaxformer-translate --workdir '{workdir}' < input.en > output.fr"
    save(RunDirectory(workdir).best, params, metadata.replace(step=10, bleu=3.0))
    suggested = field(run_summary(config, workdir, last, seconds=1.0), "translate: ")
    assert suggested == f"jaxformer-translate --workdir '{workdir}' --checkpoint best < input.en > output.fr"
    for checkpoint, stale in (("latest", False), ("best", False), ("final", True)):  # what translate says of each
        caplog.clear()
        load_checkpoint(workdir, checkpoint, params=False)
        assert ("the run trained past it" in caplog.text) == stale, checkpoint


def test_summary_without_checkpoints(tmp_path):
    lines = run_summary(load_config("tiny"), tmp_path, {"step": 0}, seconds=3.25)
    assert lines[0] == "run finished: 0 steps (0 -> 0 of 40) in 3.2 s"
    assert lines[-1] == f"checkpoints: none saved in {tmp_path}"
    assert not any(line.startswith("translate:") for line in lines)


def test_durations():
    assert [format_duration(s) for s in (0.04, 59.94, 60, 3599, 3600, 7380)] == [
        "0.0 s",
        "59.9 s",
        "1 min 00 s",
        "59 min 59 s",
        "1 h 00 min",
        "2 h 03 min",
    ]


def test_a_run_ended_by_its_time_budget_names_that_budget_when_started_again_without_it(tmp_path):
    """A finished run started again keeps its last_metrics.json's `ended_by` (it trained no step);
    the summary named the budget of the command now, `of 0 minutes` where it gives none."""
    config = load_config("tiny")  # no time budget
    kept = {"step": 930, "first_step": 930, "ended_by": "time budget", "time_budget_minutes": 0.5}
    assert "ended by its time budget of 0.5 minutes" in run_summary(config, tmp_path, kept, seconds=1.0)
    older = {"step": 930, "first_step": 930, "ended_by": "time budget"}  # written before the budget was kept
    assert "ended by its time budget" in run_summary(config, tmp_path, older, seconds=1.0)
    config.training.time_budget_minutes = 0.2  # the budget now, already spent: the record's, once there
    assert "ended by its time budget of 0.2 minutes" in run_summary(config, tmp_path, older, seconds=1.0)
