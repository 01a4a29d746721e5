"""jaxformer-sweep: variants trained one after another, scored by their final choice's validation
BLEU (read back from each variant's final checkpoint), a second run that trains nothing, and the
variants and seeds a sweep file gives (the variants and flags refused before anything trains:
test_sweep_variants.py)."""

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxformer.commands.sweep import results_table
from jaxformer.configs.sweeps import multi30k_hour
from jaxformer.run.loading import load_checkpoint
from jaxformer.training.final_choice import CANDIDATES
from jaxformer.training.sweep import make_variants, seed_run_name, with_seed_offset
from jaxformer.training.sweep_file import load_sweep
from jaxformer.training.sweep_rows import seeds_row
from tests.training.test_loop import ONE_LAYER, ROOT, environment

pytestmark = pytest.mark.xdist_group("sweep")

TINY = str(ROOT / "jaxformer" / "configs" / "tiny.py")
SHARED = (
    "--config.training.num_train_steps=12",
    "--config.training.eval_every_steps=6",
    "--config.training.checkpoint_every_steps=6",
    "--config.training.final_choice=True",
    "--config.training.average_last=2",
    "--config.data.max_eval_examples=16",
    "--config.decoding.beam_size=2",
    "--config.decoding.max_extra_length=8",
    *ONE_LAYER,
)


def write_sweep(path, sweep):
    path.write_text(f"def get_sweep():\n    return {sweep!r}\n")
    return path


def sweep(workdir, sweep_file, data_dir, *flags):
    # --baseline_steps sets the steps: SHARED's step count would be refused beside it.
    shared = [flag for flag in SHARED if "--baseline_steps" not in flags or "num_train_steps" not in flag]
    return subprocess.run(
        [sys.executable, "-m", "jaxformer.commands.sweep", "--config", TINY, "--sweep", str(sweep_file)]
        + ["--workdir", str(workdir), f"--config.data.data_dir={data_dir}", *shared, *flags],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


@pytest.mark.slow  # two real runs (about 39 s); the sweep's tables, checks and signals are tested with stand-ins
def test_a_sweep_trains_each_variant_and_ranks_them_by_validation_bleu(tmp_path, data_dir):
    # A variant that changes the data order, not the programs: the second run compiles nothing new.
    sweep_file = write_sweep(tmp_path / "two.py", {"baseline": [], "shuffle1": ["data.shuffle_seed=1"]})
    workdir = tmp_path / "sweep"
    result = sweep(workdir, sweep_file, data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (workdir / "sweep.jsonl").read_text().splitlines()]
    assert [row["variant"] for row in rows] == ["baseline", "shuffle1"]
    for row in rows:
        step, metadata, _ = load_checkpoint(workdir / row["variant"], "final", params=False)
        assert row["steps"] == step == 12
        assert row["bleu"] == pytest.approx(metadata.bleu) and row["chosen"] == metadata.chosen_from
        assert (
            row[f"{row['chosen']}_bleu"]
            == row["bleu"]
            == max(row[f"{name}_bleu"] for name in CANDIDATES if row[f"{name}_bleu"] is not None)
        )
        assert metadata.config["data"]["shuffle_seed"] == (1 if row["variant"] == "shuffle1" else 0)
    assert rows[1]["changes"] == "data.shuffle_seed=1"
    table = (workdir / "sweep.md").read_text()
    assert table in result.stdout
    ranked = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert ranked == [row["variant"] for row in sorted(rows, key=lambda row: -row["bleu"])]
    assert not list(workdir.glob("*/test*"))  # scored on validation only

    metrics = {row["variant"]: (workdir / row["variant"] / "metrics.jsonl").read_bytes() for row in rows}
    again = sweep(workdir, sweep_file, data_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == result.stdout
    assert "already finished" in again.stderr
    assert {name: (workdir / name / "metrics.jsonl").read_bytes() for name in metrics} == metrics  # nothing trained
    # Variants trained on the config's own budget are not mixed with step-budget ones.
    paced = sweep(workdir, sweep_file, data_dir, "--baseline_steps", "10")
    assert paced.returncode == 2 and "not a --baseline_steps one" in paced.stderr, paced.stderr[-2000:]
    # An edited sweep file: the finished run is not reported as the edited variant's.
    edited = write_sweep(tmp_path / "edited.py", {"baseline": [], "shuffle1": ["data.shuffle_seed=2"]})
    stale = sweep(workdir, edited, data_dir)
    assert stale.returncode == 2, stale.stderr[-2000:]
    assert stale.stderr.strip().splitlines()[-1] == (
        f"error: variant 'shuffle1' finished in {workdir / 'shuffle1'} with another configuration than the sweep "
        f"gives it now: data.shuffle_seed: 1 -> 2; sweep in a new --workdir, or remove {workdir / 'shuffle1'} to "
        "train it again"
    )
    # A learning rate that a resumed run may change is no such thing for a finished run's result.
    relearned = write_sweep(
        tmp_path / "lr.py", {"baseline": [], "shuffle1": ["data.shuffle_seed=1", "optimizer.learning_rate_scale=3.0"]}
    )
    stale = sweep(workdir, relearned, data_dir)
    assert stale.returncode == 2 and "optimizer.learning_rate_scale: 2.0 -> 3.0;" in stale.stderr, stale.stderr[-2000:]
    assert {name: (workdir / name / "metrics.jsonl").read_bytes() for name in metrics} == metrics
    # Nor for a stopped run that would resume: its steps so far were trained with the saved values.
    shutil.copytree(workdir / "shuffle1", workdir / "stopped")
    (workdir / "stopped" / "last_metrics.json").unlink()  # as a run stopped before its end leaves it
    for overrides, difference in (
        (["data.shuffle_seed=2"], "data.shuffle_seed: 1 -> 2"),
        (["data.shuffle_seed=1", "optimizer.learning_rate_scale=3.0"], "optimizer.learning_rate_scale: 2.0 -> 3.0"),
    ):
        stale = sweep(workdir, write_sweep(tmp_path / "stopped.py", {"stopped": overrides}), data_dir)
        assert stale.returncode == 2, stale.stderr[-2000:]
        assert stale.stderr.strip().splitlines()[-1] == (
            f"error: variant 'stopped' stopped at step 12 in {workdir / 'stopped'} with another configuration than "
            f"the sweep gives it now: {difference}; sweep in a new --workdir, or remove {workdir / 'stopped'} to "
            "train it again"
        )
    shutil.rmtree(workdir / "stopped")
    # A variant's error found only in its data names it; the finished rows, and the earlier one of a
    # variant this sweep file leaves out, stay in the table (unit-tested in test_sweep_tables.py).
    big = sweep(
        workdir, write_sweep(tmp_path / "big.py", {"baseline": [], "big": ["tokenizer.vocab_size=60000"]}), data_dir
    )
    assert big.returncode == 2 and big.stderr.count("error: ") == 1, big.stderr[-2000:]
    assert big.stderr.strip().splitlines()[-1].startswith("error: variant 'big': cannot train a 60000-piece")
    kept = {row["variant"]: row for row in map(json.loads, (workdir / "sweep.jsonl").read_text().splitlines())}
    assert kept == {"baseline": rows[0], "shuffle1": {**rows[1], "from_earlier_invocation": True}}
    assert not (workdir / "big").exists()


@pytest.mark.slow  # a pace and two runs; the pace is unit-tested in test_pace.py
def test_a_step_budget_gives_each_variant_the_reference_steps_times_its_measured_speed(tmp_path, data_dir):
    sweep_file = write_sweep(
        tmp_path / "paced.py",
        {"baseline": [], "wide": ["model.d_model=128", "model.d_ff=512"]},
    )
    workdir = tmp_path / "sweep"
    result = sweep(workdir, sweep_file, data_dir, "--baseline_steps", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["variant"]: row for row in map(json.loads, (workdir / "sweep.jsonl").read_text().splitlines())}
    paces = {name: json.loads((workdir / "pace" / f"{name}.json").read_text()) for name in rows}
    assert paces["baseline"]["steps"] == 10 and not paces["baseline"]["timed"]
    wide = paces["wide"]
    assert wide["timed"] and wide["speed"] < 0.8  # a larger model, measured slower
    assert wide["steps"] == max(1, round(10 * wide["reference_seconds_per_step"] / wide["seconds_per_step"]))
    for name, row in rows.items():
        step, metadata, _ = load_checkpoint(workdir / name, "final", params=False)
        assert row["steps"] == step == paces[name]["steps"]
        assert row["speed"] == pytest.approx(paces[name]["speed"])
        assert metadata.config["training"]["num_train_steps"] == paces[name]["steps"]
        assert metadata.config["training"]["time_budget_minutes"] == 0
    assert "| speed |" in (workdir / "sweep.md").read_text()

    for flags, message in [
        (["--baseline_steps", "12"], "for --baseline_steps 10"),
        ([], "run with --baseline_steps 10"),
    ]:
        again = sweep(workdir, sweep_file, data_dir, *flags)
        assert again.returncode == 2 and message in again.stderr, again.stderr[-2000:]
        assert again.stderr.count("error: ") == 1


@pytest.mark.slow  # three runs; the seeds' configs and their row are unit-tested below
def test_seeds_train_each_variant_again_with_moved_seeds_and_rank_by_the_mean(tmp_path, data_dir):
    sweep_file = write_sweep(tmp_path / "one.py", {"baseline": []})
    workdir = tmp_path / "sweep"
    first = sweep(workdir, sweep_file, data_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    seed0_metrics = (workdir / "baseline" / "metrics.jsonl").read_bytes()

    result = sweep(workdir, sweep_file, data_dir, "--seeds", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"already finished in {workdir / 'baseline'}" in result.stderr  # the one-seed run is seed 0
    assert (workdir / "baseline" / "metrics.jsonl").read_bytes() == seed0_metrics
    (row,) = [json.loads(line) for line in (workdir / "sweep.jsonl").read_text().splitlines()]
    finals = [load_checkpoint(workdir / name, "final") for name in ("baseline", "baseline@seed1")]
    configs = [metadata.config for _, metadata, _ in finals]
    assert configs[1]["training"]["seed"] == configs[0]["training"]["seed"] + 1
    assert configs[1]["data"]["shuffle_seed"] == configs[0]["data"]["shuffle_seed"] + 1
    first_kernel, second_kernel = (
        jax.tree_util.tree_leaves(params)[0] for _, _, params in finals
    )  # another initialisation and another order of batches: other parameters
    assert not np.array_equal(np.asarray(first_kernel), np.asarray(second_kernel))
    bleus = [metadata.bleu for _, metadata, _ in finals]
    assert row["seed_bleus"] == pytest.approx(bleus)
    assert row["bleu"] == pytest.approx(sum(bleus) / 2)
    assert [seed["chosen"] for seed in row["seeds"]] == [metadata.chosen_from for _, metadata, _ in finals]
    assert row["steps"] == 12
    table = (workdir / "sweep.md").read_text()
    assert "| per seed |" in table and f"{bleus[0]:.2f}, {bleus[1]:.2f}" in table

    again = sweep(workdir, sweep_file, data_dir, "--seeds", "2")
    assert again.returncode == 0 and again.stdout == result.stdout, again.stderr[-3000:]
    assert again.stderr.count("already finished") == 2
    bad = sweep(workdir, sweep_file, data_dir, "--seeds", "0")
    assert bad.returncode == 2 and "--seeds: must be an integer >= 1, got 0" in bad.stderr, bad.stderr[-2000:]


def test_the_shipped_sweep_builds_every_variant():
    sweep = load_sweep("multi30k_hour")
    variants = make_variants("multi30k", sweep)
    assert variants[0].name == "baseline" and variants[0].overrides == ()
    for variant in variants[1:]:
        assert variant.overrides, variant.name
        for key, text in variant.overrides:
            section, leaf = key.split(".")
            assert str(variant.config[section][leaf]) == text  # applied as written
    assert all(variant.config.training.final_choice for variant in variants)
    # Its docstring, which `jaxformer-sweep --help` users read, counts the runs it makes.
    count = f"{len(variants) - 1} variants and the baseline, {len(variants)} runs"
    assert count in " ".join(multi30k_hour.__doc__.split())


def test_seed_k_moves_both_seeds_by_k_and_the_variant_scores_its_seeds_mean():
    (variant,) = make_variants(
        TINY, {"baseline": []}, [("training.final_choice", "True"), ("training.average_last", "2")]
    )
    assert with_seed_offset(variant.config, 0) is variant.config  # seed 0: the run of a one-seed sweep
    moved = with_seed_offset(variant.config, 2)
    assert moved.training.seed == variant.config.training.seed + 2
    assert moved.data.shuffle_seed == variant.config.data.shuffle_seed + 2
    assert moved.model == variant.config.model and moved.optimizer == variant.config.optimizer
    assert [seed_run_name(variant, k) for k in range(3)] == ["baseline", "baseline@seed1", "baseline@seed2"]

    def seed(bleu, steps, chosen, lowercase=None):
        row = {"variant": "baseline", "changes": "", "speed": None, "steps": steps, "train_minutes": 1.0}
        row.update(bleu=bleu, lowercase_bleu=lowercase, chrf=50.0, chosen=chosen, alpha=1.4)
        return row | {f"{name}_bleu": bleu for name in CANDIDATES}

    row = seeds_row([seed(30.0, 100, "best", 31.0), seed(32.0, 103, "averaged", None)])
    assert row["bleu"] == 31.0 and row["seed_bleus"] == [30.0, 32.0] and row["steps"] == 102
    assert row["lowercase_bleu"] is None  # one seed lacks it: no mean
    assert row["chosen"] == "best, averaged" and row["alpha"] is None and len(row["seeds"]) == 2
    table = results_table([row])
    assert "| per seed |" in table and "30.00, 32.00" in table and "31.00" in table


def test_a_stopped_run_without_a_readable_checkpoint_is_left_to_training(tmp_path):
    """Only a checkpoint tells how a stopped run was configured: one without (a start killed
    while writing its first) is not refused by the sweep; training names or replaces it."""
    from jaxformer.training.sweep_checks import run_problems

    (variant,) = make_variants(
        TINY, {"wide": ["model.d_model=64"]}, [("training.final_choice", "True"), ("training.average_last", "2")]
    )
    run_dir = tmp_path / "wide"
    (run_dir / "checkpoints").mkdir(parents=True)  # no step in it
    assert run_problems(run_dir, variant, variant.config) == []
