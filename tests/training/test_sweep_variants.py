"""jaxformer-sweep's refusals of the variants a sweep file gives and of the flags beside them (a
bad override, one that changes nothing training reads, the same config twice, a name written
twice, other validation pairs, a step count against --baseline_steps, a language model's config),
each one line before anything trains, with nothing written."""

import re

import pytest

from jaxformer.commands import sweep as sweep_command
from jaxformer.model.config import ConfigError
from jaxformer.training.sweep import make_variants
from jaxformer.training.sweep_file import load_sweep
from tests.training.test_sweep import SHARED, TINY, write_sweep

pytestmark = pytest.mark.xdist_group("sweep")


@pytest.mark.parametrize(
    "variants, message",
    [
        ({"wide": ["model.d_modle=64"]}, r"variant 'wide': .*model\.d_modle"),
        ({"odd": ["model.d_model"]}, r"variant 'odd': override 'model.d_model' is not KEY=VALUE"),
        # Quoted as the sweep file writes them, not as a --config. flag the user never typed.
        ({"rate": ["model.dropout_rate=abc"]}, r"variant 'rate': model\.dropout_rate=abc: must be a number$"),
        ({"choice": ["training.final_choice=maybe"]}, r"variant 'choice': training\.final_choice=maybe: must be True"),
        ({"size": ["model.preset=huge"]}, r"variant 'size': model\.preset=huge: must be one of tiny, base, big$"),
        ({"whole": ["training=3"]}, r"variant 'whole': training is a section, not a value"),
        (
            {"twice": ["model.dropout_rate=0.2", "model.dropout_rate=0.3"]},
            r"variant 'twice': config key 'model.dropout_rate' is given twice, as '0.2' and as '0.3'",
        ),
        (
            {"bad": ["model.d_model=30"]},
            r"variant 'bad': config model\.d_model=30: must be divisible by model\.num_heads=4$",
        ),
        ({"a b": []}, r"variant name 'a b' must match"),
        # Overrides not written as a list of strings: no traceback, and a dict's values are not dropped unread.
        ({"five": 5}, r"variant 'five' must list its overrides as strings KEY=VALUE, not 5$"),
        ({"unset": None}, r"variant 'unset' must list its overrides as strings KEY=VALUE, not None$"),
        ({"keyed": {"model.d_ff": "128"}}, r"variant 'keyed' must list .* not \{'model.d_ff': '128'\}$"),
        (
            {"one": "model.d_ff=128"},
            r"variant 'one' must list .*, not 'model.d_ff=128': a string alone is no list; write \['model.d_ff=128'\]$",
        ),
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
        # was "'baseline' ((the config as it is))"
        ({"same": []}, r"variants 'baseline' \(the config as it is\) and 'same' \(the config as it is\) give the same"),
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


def refusal(sweep, *shared):
    """make_variants' error for tiny's baseline and `sweep`'s variants with `shared` (key, value)
    overrides (and a final choice, which a sweep needs); None where it builds them."""
    shared = [("training.final_choice", "True"), ("training.average_last", "2"), *shared]
    try:
        make_variants(TINY, {"baseline": [], **sweep}, shared)
    except ConfigError as error:
        return str(error)
    return None


def test_a_variant_that_repeats_the_commands_override_names_it():
    """Was "model.d_ff=128 changes nothing in '.../tiny.py' (its values already)", tiny's being 64."""
    assert refusal({"a": ["model.d_ff=128"]}, ("model.d_ff", "128")) == (
        f"variant 'a': model.d_ff=128 changes nothing in {TINY!r} with the command's --config.model.d_ff=128 "
        "(its values already): training it would repeat the config as it is"
    )


def test_a_variant_is_refused_only_where_nothing_during_training_reads_what_it_changes():
    """Validation BLEU during training reads the search, and decides what best/ keeps: a length
    penalty changes a run whose validation BLEU searches a beam, not one whose searches greedily."""
    alpha, batch = {"alpha1": ["decoding.alpha=1.0"]}, {"batch8": ["decoding.batch_size=8"]}
    mixed = {"mixed": ["decoding.alpha=1.0", "model.dropout_rate=0.2"]}  # trains otherwise: compared
    assert refusal(alpha).startswith("variant 'alpha1': decoding.alpha=1.0 changes only what the final choice")
    assert refusal(batch) is not None and refusal(mixed) is None
    by_bleu = ("training.bleu_every_steps", "6")
    assert refusal(alpha, by_bleu) is None and refusal(batch, by_bleu) is None
    assert "training.average_last" in refusal({"average3": ["training.average_last=3"]}, by_bleu)
    greedy = ("training.bleu_method", "greedy")
    assert "(decoding.alpha)" in refusal(alpha, by_bleu, greedy)
    assert refusal({"longer": ["decoding.max_extra_length=16"]}, by_bleu, greedy) is None  # greedy reads it


def test_a_variant_that_changes_only_what_its_fine_tuning_start_replaces_is_refusal(tmp_path):
    """Fine-tuning, the start's tokenizer is the run's: a variant of the vocabulary's size or its
    training options would train the config as it is again (and be timed with another model's
    vocabulary under --baseline_steps). Without a start they change the run."""
    start = ("training.init_from", str(tmp_path / "parent"))  # read only when a run starts
    vocabulary = {"vocab2000": ["tokenizer.vocab_size=2000"]}
    assert refusal(vocabulary, start) == (
        "variant 'vocab2000': tokenizer.vocab_size=2000 changes only settings that its run does not use "
        "(tokenizer.vocab_size: no tokenizer is trained: training.init_from gives the vocabulary), so it would "
        "train the config as it is again; remove it, or change what the run uses"
    )
    assert "(tokenizer.model_type: no tokenizer is trained" in refusal({"bpe": ["tokenizer.model_type=bpe"]}, start)
    assert refusal(vocabulary) is None and refusal({"bpe": ["tokenizer.model_type=bpe"]}) is None
    assert refusal({"mixed": ["tokenizer.vocab_size=2000", "model.dropout_rate=0.2"]}, start) is None


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
    sweep_file.write_text('def get_sweep():\n    return {"a": [], "b": ["c=1"], "a": ["c=2"]}\n')
    with pytest.raises(ConfigError, match=r"key 'a' is written twice in one dict, on line 2, and Python keeps "):
        load_sweep(str(sweep_file))  # was "lines 2 and 2"
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

    def refusal(sweep, *flags):
        sweep_file = write_sweep(tmp_path / "own.py", sweep)
        flags = ("--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *SHARED, *own_data, *flags)
        code = sweep_command.main(list(flags))
        error = capsys.readouterr().err
        assert code == 2 and error.count("\n") == 1 and not workdir.exists(), error
        return error

    # The pairs held out of the training file are drawn with data.shuffle_seed, which --seeds moves.
    assert "--seeds 2: seed k moves data.shuffle_seed" in refusal({"baseline": []}, "--seeds", "2")
    error = refusal({"baseline": [], "shuffled": ["data.shuffle_seed=5"]})
    assert "variant 'shuffled': data.shuffle_seed=5 (the others: 0) changes the validation pairs" in error
    error = refusal({"baseline": [], "holdout": ["data.validation_holdout=5"]})
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
def test_a_step_count_or_time_budget_beside_baseline_steps_is_refusal(tmp_path, capsys, variant, flag, message):
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
