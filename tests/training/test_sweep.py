"""jaxformer-sweep: variants trained one after another, scored by their final choice's validation
BLEU (read back from each variant's final checkpoint), a second run that trains nothing, and the
errors raised before anything trains."""

import json
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxformer.commands import sweep as sweep_command
from jaxformer.commands.sweep import results_table
from jaxformer.configs.sweeps import multi30k_hour
from jaxformer.model.config import ConfigError
from jaxformer.run.loading import load_checkpoint
from jaxformer.training.final_choice import CANDIDATES
from jaxformer.training.sweep import make_variants, seed_run_name, seeds_row, with_seed_offset
from jaxformer.training.sweep_file import load_sweep
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


@pytest.mark.parametrize(
    "variants, message",
    [
        ({"wide": ["model.d_modle=64"]}, r"variant 'wide': .*model\.d_modle"),
        ({"odd": ["model.d_model"]}, r"variant 'odd': override 'model.d_model' is not KEY=VALUE"),
        (
            {"twice": ["model.dropout_rate=0.2", "model.dropout_rate=0.3"]},
            r"variant 'twice': config key 'model.dropout_rate' is given twice, as '0.2' and as '0.3'",
        ),
        ({"bad": ["model.d_model=30"]}, r"variant 'bad': .*d_model"),
        ({"a b": []}, r"variant name 'a b' must match"),
        # Overrides not written as a list of strings: no traceback, and a dict's values are not dropped unread.
        ({"five": 5}, r"variant 'five' must list its overrides as strings KEY=VALUE, not 5$"),
        ({"unset": None}, r"variant 'unset' must list its overrides as strings KEY=VALUE, not None$"),
        ({"keyed": {"model.d_ff": "128"}}, r"variant 'keyed' must list .* not \{'model.d_ff': '128'\}$"),
        ({"one": "model.d_ff=128"}, r"variant 'one' must list its overrides as strings KEY=VALUE, not 'model"),
        ({"mixed": ["model.d_ff=128", 3]}, r"variant 'mixed' must list .*, not \['model.d_ff=128', 3\]$"),
        # The sweep's own files and folder: a variant's run there would overwrite them, or they it.
        ({"sweep.jsonl": ["model.dropout_rate=0.2"]}, r"variant name 'sweep.jsonl' is taken: .* sweep.md, pace"),
        ({"Sweep.md": ["model.dropout_rate=0.2"]}, r"variant name 'Sweep.md' is taken"),
        ({"pace": ["model.dropout_rate=0.2"]}, r"variant name 'pace' is taken"),
        ({"no_choice": ["training.final_choice=False"]}, r"variant 'no_choice': training.final_choice is False"),
        # tiny's own width, and a value the shared overrides already set: the baseline again.
        ({"same": ["model.d_model=32"]}, r"variant 'same': model.d_model=32 changes nothing in '.*tiny.py'"),
        ({"again": ["training.average_last=2"]}, r"variant 'again': training.average_last=2 changes nothing"),
        # Read by the final choice alone (tiny validates no BLEU during training): the config's parameters again.
        (
            {"beam8": ["decoding.beam_size=8", "training.final_alphas=(1.0,1.4)", "training.average_last=3"]},
            r"variant 'beam8': decoding.beam_size=8, training.final_alphas=\(1.0,1.4\), training.average_last=3 "
            r"changes only what the final choice reads after training \(decoding.beam_size, training.average_last, "
            r"training.final_alphas\), so its run would train the parameters of the config as it is again; .*"
            r"jaxformer-evaluate --split validation",
        ),
        # Scored on other pairs, its BLEU would be ranked against the others' over other sentences.
        (
            {"subset": ["data.max_eval_examples=8"]},
            r"variant 'subset': data.max_eval_examples=8 \(the others: 16\) changes the validation pairs",
        ),
        ({"reverse": ["data.source_language=de", "data.target_language=en"]}, r"variant 'reverse': data.source_lang"),
        # A run's folder, its pace's file and a seed's folder are named after it: 300 characters is no file name.
        ({"x" * 300: []}, r"variant name x{20}\.\.\. is 300 characters long, more than the 100 its runs' folders"),
        ({"x" * 101: ["model.dropout_rate=0.2"]}, r"variant name x{20}\.\.\. is 101 characters long"),
        # The same thing trained twice under two names, however its values are written.
        (
            {"a": ["model.dropout_rate=0.2"], "b": ["model.dropout_rate=0.20"]},
            r"variants 'a' \(model.dropout_rate=0.2\) and 'b' \(model.dropout_rate=0.20\) give the same config: "
            r"the sweep would train it twice; keep one",
        ),
    ],
)
def test_a_bad_variant_is_one_line_before_anything_trains(tmp_path, capsys, variants, message):
    sweep_file = write_sweep(tmp_path / "bad.py", {"baseline": [], **variants})
    workdir = tmp_path / "sweep"
    code = sweep_command.main(["--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *SHARED])
    error = capsys.readouterr().err
    assert code == 2 and error.startswith("error: ") and error.count("\n") == 1
    assert re.search(message, error), error
    assert not workdir.exists()


def test_a_variant_is_refused_only_where_nothing_during_training_reads_what_it_changes():
    """Validation BLEU during training reads the search, and decides what best/ keeps: a length
    penalty changes a run whose validation BLEU searches a beam, not one whose searches greedily."""

    def refused(sweep, *shared):
        shared = [("training.final_choice", "True"), ("training.average_last", "2"), *shared]
        try:
            make_variants(TINY, {"baseline": [], **sweep}, shared)
        except ConfigError as error:
            return str(error)
        return None

    alpha, batch = {"alpha1": ["decoding.alpha=1.0"]}, {"batch8": ["decoding.batch_size=8"]}
    mixed = {"mixed": ["decoding.alpha=1.0", "model.dropout_rate=0.2"]}  # trains otherwise: compared
    assert refused(alpha).startswith("variant 'alpha1': decoding.alpha=1.0 changes only what the final choice")
    assert refused(batch) is not None and refused(mixed) is None
    by_bleu = ("training.bleu_every_steps", "6")
    assert refused(alpha, by_bleu) is None and refused(batch, by_bleu) is None
    assert "training.average_last" in refused({"average3": ["training.average_last=3"]}, by_bleu)
    greedy = ("training.bleu_method", "greedy")
    assert "(decoding.alpha)" in refused(alpha, by_bleu, greedy)
    assert refused({"longer": ["decoding.max_extra_length=16"]}, by_bleu, greedy) is None  # greedy reads it


def test_a_variant_name_written_twice_in_the_sweep_file_is_refused_naming_both_lines(tmp_path, capsys):
    """Python keeps the second of two equal keys of a dict display: the first variant would be lost."""
    sweep_file = tmp_path / "twice.py"
    sweep_file.write_text(
        "def get_sweep():\n"
        "    return {\n"
        '        "a": ["model.dropout_rate=0.2"],\n'
        '        "b": ["model.dropout_rate=0.3"],\n'
        '        "a": ["training.label_smoothing=0.0"],\n'
        "    }\n"
    )
    workdir = tmp_path / "sweep"
    code = sweep_command.main(["--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *SHARED])
    assert code == 2 and capsys.readouterr().err == (
        f"error: sweep file {sweep_file}: key 'a' is written twice in one dict, lines 3 and 5, and Python keeps "
        "only the second: rename or remove one\n"
    )
    assert not workdir.exists()
    x_100 = "x" * 100  # the longest name: its seed's folder (x...x@seed12) is still a file name
    assert load_sweep(str(write_sweep(tmp_path / "long.py", {x_100: [], "b": ["c=1"]}))) == {x_100: [], "b": ["c=1"]}


def test_held_out_validation_pairs_must_be_the_same_for_every_variant_and_seed(tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"source {i}\ttarget {i}\n" for i in range(40)), encoding="utf-8")
    own_data = (
        "--config.data.name=parallel_files",
        f"--config.data.files.train={pairs}",
        "--config.data.validation_holdout=10",
        "--config.data.source_language=xx",
        "--config.data.target_language=yy",
    )
    workdir = tmp_path / "sweep"

    def refused(sweep, *flags):
        sweep_file = write_sweep(tmp_path / "own.py", sweep)
        flags = ("--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *SHARED, *own_data, *flags)
        code = sweep_command.main(list(flags))
        error = capsys.readouterr().err
        assert code == 2 and error.count("\n") == 1 and not workdir.exists(), error
        return error

    # The pairs held out of the training file are drawn with data.shuffle_seed, which --seeds moves.
    assert "--seeds 2: seed k moves data.shuffle_seed" in refused({"baseline": []}, "--seeds", "2")
    error = refused({"baseline": [], "shuffled": ["data.shuffle_seed=5"]})
    assert "variant 'shuffled': data.shuffle_seed=5 (the others: 0) changes the validation pairs" in error
    error = refused({"baseline": [], "holdout": ["data.validation_holdout=5"]})
    assert "variant 'holdout': data.validation_holdout=5 (the others: 10)" in error


def test_a_variant_that_contradicts_the_step_budget_is_named_before_anything_trains(tmp_path, capsys):
    sweep_file = write_sweep(tmp_path / "late.py", {"baseline": [], "warmup30": ["optimizer.warmup_steps=30"]})
    workdir = tmp_path / "sweep"
    budget = ["--baseline_steps", "12", "--config.optimizer.schedule=budget", "--config.optimizer.warmup_steps=4"]
    shared = [flag for flag in SHARED if not flag.startswith("--config.training.num_train_steps=")]  # tiny's 40
    code = sweep_command.main(
        ["--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *shared, *budget]
    )
    error = capsys.readouterr().err
    assert code == 2 and error.startswith(
        "error: variant 'warmup30' at 12 steps: config training.num_train_steps=12 ends within "
        "optimizer.warmup_steps=30"
    ), error
    assert not workdir.exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    "variant, flag, message",
    [
        (
            ["training.num_train_steps=100"],
            None,
            "variant 'own': training.num_train_steps=100 with --baseline_steps 12: --baseline_steps sets each "
            "variant's steps (its speed relative to the config's, times 12); drop it from the sweep file, or run "
            "without --baseline_steps",
        ),
        (
            ["training.time_budget_minutes=5"],
            None,
            "variant 'own': training.time_budget_minutes=5 with --baseline_steps 12: --baseline_steps sets",
        ),
        (
            ["model.dropout_rate=0.2"],
            "--config.training.time_budget_minutes=30",
            "--config.training.time_budget_minutes=30 with --baseline_steps 12: --baseline_steps sets each "
            "variant's steps (its speed relative to the config's, times 12); drop one of the two",
        ),
        (["model.dropout_rate=0.2"], "--config.training.num_train_steps=12", "--config.training.num_train_steps=12 "),
    ],
)
def test_a_step_count_or_time_budget_beside_baseline_steps_is_refused(tmp_path, capsys, variant, flag, message):
    """--baseline_steps gives each variant its steps: a variant's own count or budget, or the
    command line's, would be replaced unseen, and the table would show the variant as if it held."""
    sweep_file = write_sweep(tmp_path / "steps.py", {"baseline": [], "own": variant})
    workdir = tmp_path / "sweep"
    shared = [flag for flag in SHARED if not flag.startswith("--config.training.num_train_steps=")]
    flags = ["--baseline_steps", "12", *([flag] if flag else [])]
    code = sweep_command.main(
        ["--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *shared, *flags]
    )
    error = capsys.readouterr().err
    assert code == 2 and error.startswith(f"error: {message}") and error.count("\n") == 1, error
    assert not workdir.exists()


@pytest.mark.parametrize("config_name", ["multi30k_lm", "multi30k_mlm"])
def test_a_language_model_config_is_refused_naming_its_architecture(tmp_path, capsys, config_name):
    """A sweep ranks translators by validation BLEU. A language model's config was refused for its
    training.final_choice=False, with the hint to set it True, which that config then refuses."""
    sweep_file = write_sweep(tmp_path / "rates.py", {"baseline": [], "slow": ["optimizer.learning_rate_scale=0.3"]})
    workdir = tmp_path / "sweep"
    for shared in ([], ["--config.training.final_choice=True"]):
        arguments = ["--config", config_name, "--sweep", str(sweep_file), "--workdir", str(workdir), *shared]
        code = sweep_command.main(arguments)
        error = capsys.readouterr().err
        assert code == 2 and error.count("\n") == 1 and not workdir.exists(), error
        if not shared:
            architecture = config_name.replace("multi30k_lm", "decoder_only").replace("multi30k_mlm", "encoder_only")
            assert error.startswith(f"error: variant 'baseline': model.architecture='{architecture}': a sweep "), error
            assert "final_choice" not in error


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
