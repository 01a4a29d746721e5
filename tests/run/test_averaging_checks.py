"""Averaging only one run's checkpoints (average_checkpoints and the final choice's average), and a
final choice kept only while the settings it was made with stay."""

import copy
import json
import logging
import os
import shutil
import types

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.commands import average_checkpoints
from jaxformer.errors import CheckpointError, UserError
from jaxformer.run.averaging import average_last, averaged_last
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.lock import WorkdirLock
from jaxformer.training import final_choice
from tests.conftest import make_workdir, scored_validation

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("averaging-checks")


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    """A run with checkpoints 10 and 20 (step k holds k / 10 times the first parameters)."""
    workdir, params, _ = make_workdir(
        tmp_path_factory.mktemp("template") / "run", steps=(10, 20), scale=lambda s: s / 10
    )
    return workdir, params


def add_checkpoint(workdir, step, params, change_config=None, **metadata_changes):
    """Checkpoint `step` of `params` with step 20's metadata, its config changed by `change_config`."""
    metadata = load_checkpoint(workdir, 20, params=False)[1]
    config = copy.deepcopy(metadata.config)
    if change_config:
        change_config(config)
    checkpointer = Checkpointer(RunDirectory(workdir).checkpoints, keep=None)
    checkpointer.save_params(step, params, metadata.replace(step=step, config=config, **metadata_changes))
    checkpointer.close()


def average(workdir, capsys, last=3):
    code = average_checkpoints.main(["--workdir", str(workdir), "--last", str(last)])
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.splitlines() if line.startswith("error: ")]


def test_a_step_of_another_model_is_refused_before_its_parameters_are_read(run, capsys):
    workdir, params = run
    wider = jax.tree.map(lambda leaf: np.concatenate([leaf, leaf], axis=-1), params)  # every shape differs

    def wider_ff(config):
        config["model"]["d_ff"] *= 2

    metadata = load_checkpoint(workdir, 20, params=False)[1]
    add_checkpoint(workdir, 30, wider, wider_ff, model={**metadata.model, "d_ff": metadata.model["d_ff"] * 2})
    code, _, errors = average(workdir, capsys)
    checkpoints = RunDirectory(workdir).checkpoints
    assert code == 2 and errors == [
        f"error: checkpoints 10 and 30 of {checkpoints} are not of one run (step 10 -> step 30: model.d_ff: 64 -> "
        "128), so they cannot be averaged; move the other run's checkpoint out of that folder, or use checkpoint 30 "
        "itself (an average of one is that checkpoint: give --checkpoint 30 where you would give --checkpoint averaged)"
    ]
    assert not RunDirectory(workdir).averaged.exists()


def test_a_step_of_a_run_with_another_config_is_refused_though_its_shapes_agree(run, capsys):
    workdir, params = run

    def other_seed(config):
        config["training"]["seed"] = 1

    add_checkpoint(workdir, 30, jax.tree.map(lambda leaf: leaf * 3, params), other_seed)
    code, _, errors = average(workdir, capsys)
    assert code == 2 and len(errors) == 1
    assert "checkpoints 10 and 30 of " in errors[0] and "(step 10 -> step 30: training.seed: 0 -> 1)" in errors[0]
    assert not RunDirectory(workdir).averaged.exists()


def test_another_tokenizer_is_refused_by_the_averaging_itself(run):
    workdir, params = run
    other = load_checkpoint(workdir, 20, params=False)[1].tokenizer + b"\x00"
    add_checkpoint(workdir, 30, params, tokenizer=other)
    with pytest.raises(CheckpointError, match=r"\(step 20 -> step 30: tokenizer: another sentencepiece model\)"):
        averaged_last(workdir, 2)


def test_what_a_resume_may_change_still_averages(run, capsys):
    """Later checkpoints of one run: a longer schedule, another warmup, a budget, an interim
    checkpoint, matmul_dtype "auto" resolved on another machine, remat turned on."""
    workdir, params = run

    def resumed(config):
        config["training"]["num_train_steps"] = 400
        config["training"]["time_budget_minutes"] = 60.0
        config["optimizer"]["warmup_steps"] = 10
        config["data"]["max_eval_examples"] = 16
        config["model"]["remat_policy"] = "full"

    metadata = load_checkpoint(workdir, 20, params=False)[1]
    model = {**metadata.model, "matmul_dtype": "bfloat16", "remat_policy": "full"}
    add_checkpoint(workdir, 30, jax.tree.map(lambda leaf: leaf * 3, params), resumed, model=model, interim=True)
    code, out, errors = average(workdir, capsys)
    assert (code, errors) == (0, []) and out.startswith("averaged steps [10, 20, 30] into ")
    averaged = load_checkpoint(workdir, "averaged")[2]
    for got, base in zip(jax.tree.leaves(averaged), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(got, 2 * np.asarray(base), rtol=1e-5, atol=1e-7)


def test_a_workdir_without_checkpoints_is_said_to_have_none(tmp_path, capsys):
    code, _, errors = average(tmp_path, capsys)
    assert code == 2 and errors == [
        f"error: {tmp_path} has no checkpoint in {RunDirectory(tmp_path).checkpoints}: nothing to average"
    ]
    assert list(tmp_path.iterdir()) == []


def test_average_last_of_a_missing_workdir_says_it_has_no_checkpoint(tmp_path):
    missing = tmp_path / "no_run"
    with pytest.raises(CheckpointError, match="has no checkpoint in .*: nothing to average"):
        average_last(missing, 2)
    assert not missing.exists()


def test_a_folder_of_a_workdir_or_an_export_given_as_the_workdir_is_named_as_what_it_is(run, capsys, tmp_path):
    """As translate and evaluate name them (run/loading.py), less the --checkpoint this command lacks."""
    workdir, _ = run
    export = tmp_path / "exported"
    export.mkdir()
    (export / "config.json").write_text(
        json.dumps({"format": "jaxformer-export", "checkpoint": {"workdir": str(workdir), "which": "best", "step": 20}})
    )
    for given, said in [
        (workdir / "checkpoints", f"is the checkpoints/ folder of the workdir {workdir}: give that workdir"),
        (workdir / "checkpoints" / "20", f"is a step folder of the workdir {workdir}: give that workdir"),
        (
            export,
            f"is an export (jaxformer-export's folder: parameters in decoding form for its program, without a "
            f"checkpoint's run config), not a training run: serve it with python {export / 'serve.py'}, or give the "
            f"run it was exported from, --workdir {workdir}",
        ),
    ]:
        code, _, errors = average(given, capsys)
        assert (code, errors) == (2, [f"error: {given} {said}"])
    assert not RunDirectory(workdir).averaged.exists() and sorted(p.name for p in export.iterdir()) == ["config.json"]


def test_the_final_choice_leaves_out_an_average_of_two_runs_with_a_warning(run, caplog):
    workdir, params = run

    def other_seed(config):
        config["training"]["seed"] = 1

    add_checkpoint(workdir, 30, params, other_seed)
    step, metadata, latest = load_checkpoint(workdir)
    with caplog.at_level(logging.WARNING):
        candidates = final_choice._candidates(RunDirectory(workdir), 3, step, latest, metadata, None)
    assert set(candidates) == {"latest"}
    (warning,) = [record.getMessage() for record in caplog.records if "final choice" in record.getMessage()]
    assert "training.seed: 0 -> 1" in warning and warning.endswith("; no average is a candidate")
    shutil.rmtree(RunDirectory(workdir).checkpoints / "30")  # one run's checkpoints: averaged, as before
    candidates = final_choice._candidates(RunDirectory(workdir), 3, 20, latest, metadata, None)
    assert candidates["averaged"][0].averaged_steps == (10, 20)


_Scored = scored_validation(lambda settings: 10.0 + settings.alpha)  # the highest alpha wins


def _config(metadata, **changes):
    config = ml_collections.ConfigDict(copy.deepcopy(metadata.config))
    config.training.average_last, config.training.final_alphas = 2, (1.0, 2.0)
    for key, value in changes.items():
        section, name = key.split("__")
        config[section][name] = value
    return config


def _chooser(workdir, monkeypatch):
    """(step, metadata, choose(config)): the loop's call of choose_final at the run's end, with
    validation scores from `_Scored` (no decoding)."""
    step, metadata, params = load_checkpoint(workdir)
    monkeypatch.setattr(final_choice, "ValidationSet", _Scored)
    tokenizers = types.SimpleNamespace(source=None, target=None)

    def choose(config):
        return final_choice.choose_final(config, None, tokenizers, None, RunDirectory(workdir), step, params, metadata)

    return step, metadata, choose


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"training__final_alphas": (1.0, 3.0)}, "training.final_alphas=(1.0, 2.0) (now (1.0, 3.0))"),
        ({"decoding__beam_size": 2}, "decoding.beam_size=4 (now 2)"),
        # The run's config has no length_penalty: made before the key, with gnmt.
        ({"decoding__length_penalty": "transformers"}, "decoding.length_penalty='gnmt' (now 'transformers')"),
        ({"decoding__method": "greedy"}, "decoding.method='beam' (now 'greedy'); it stays as it is"),
        ({"data__max_eval_examples": 2}, "data.max_eval_examples=None (now 2)"),
        # BLEU's tokenizer: the run's, with no bleu_tokenize or None, 13a for its German
        ({"training__bleu_tokenize": "char"}, "training.bleu_tokenize='13a' (now 'char')"),
    ],
)
def test_a_choice_made_with_other_settings_is_named_and_kept(changes, named, run, monkeypatch):
    workdir, _ = run
    step, metadata, choose = _chooser(workdir, monkeypatch)
    first = choose(_config(metadata))
    final = RunDirectory(workdir).final
    stored = sorted(path.name for path in final.iterdir())
    calls = _Scored.calls
    with pytest.raises(UserError) as error:
        choose(_config(metadata, **changes))
    message = str(error.value)
    assert message.startswith(f"the final choice in {final / str(step)} was made with {named}"), message
    assert f"move {final} aside" in message and "\n" not in message
    assert _Scored.calls == calls and sorted(path.name for path in final.iterdir()) == stored  # nothing redone
    assert choose(_config(metadata)) == first  # the settings it was made with: kept, and its report
    # A restart is held to it before anything is prepared (run_start), with the same message ...
    run_directory, ended, same = RunDirectory(workdir), _config(metadata, **changes), _config(metadata)
    for config in (ended, same):  # a run that ended at `step`, with its final choice
        config.training.num_train_steps, config.training.final_choice = step, True
    with pytest.raises(UserError) as early:
        final_choice.check_kept_choice(ended, run_directory, step, 0.0)
    assert str(early.value) == message
    final_choice.check_kept_choice(same, run_directory, step, 0.0)
    # ... unless it trains on: it then chooses again at its new end.
    further = _config(metadata, **changes)
    further.training.num_train_steps, further.training.final_choice = step + 10, True
    final_choice.check_kept_choice(further, run_directory, step, 0.0)
    further.training.time_budget_minutes = 1.0  # and its budget spent: it trains no further
    with pytest.raises(UserError, match="was made with"):
        final_choice.check_kept_choice(further, run_directory, step, 60.0)


@pytest.mark.parametrize(
    "changes",
    [
        {"decoding__beam_size": 2},
        {"decoding__alpha": 1.0},
        {"decoding__length_penalty": "transformers"},
        {"decoding__stop": "exact"},
        {"decoding__renormalize_after_bans": True},
    ],
)
def test_a_beam_setting_changed_under_a_greedy_choice_keeps_it(changes, run, monkeypatch):
    """Greedy search reads no beam size, alpha, length penalty or stop rule."""
    workdir, _ = run
    _, metadata, choose = _chooser(workdir, monkeypatch)
    first = choose(_config(metadata, decoding__method="greedy"))
    calls = _Scored.calls
    assert choose(_config(metadata, decoding__method="greedy", **changes)) == first and _Scored.calls == calls


@pytest.mark.parametrize(
    "changes",
    [
        {"training__average_last": 5},  # still the two checkpoints there are
        {"training__keep_checkpoints": 9},  # not a setting of the choice
        {"decoding__length_penalty": "gnmt"},  # the form the choice was made with, before the key
        {"training__bleu_tokenize": "13a"},  # the tokenizer it scored German with, before the key
    ],
)
def test_a_setting_the_choice_did_not_read_keeps_it(changes, run, monkeypatch):
    workdir, _ = run
    _, metadata, choose = _chooser(workdir, monkeypatch)
    first = choose(_config(metadata))
    calls = _Scored.calls
    assert choose(_config(metadata, **changes)) == first and _Scored.calls == calls


def test_final_alphas_under_greedy_search_keep_the_choice(run, monkeypatch):
    workdir, _ = run
    _, metadata, choose = _chooser(workdir, monkeypatch)
    first = choose(_config(metadata, decoding__method="greedy"))
    assert choose(_config(metadata, decoding__method="greedy", training__final_alphas=(3.0,))) == first


class _Lowered(Exception):
    """The export got to its lowering, with these settings."""


def test_a_choice_that_compared_no_alpha_is_searched_with_the_one_it_was_scored_with(
    run, tmp_path, monkeypatch, caplog
):
    from jaxformer.commands import decoding_flags, translate
    from jaxformer.decoding.checkpoint_alpha import checkpoint_settings
    from jaxformer.export import exporter

    workdir, _ = run
    _, metadata, choose = _chooser(workdir, monkeypatch)
    summary = choose(_config(metadata, decoding__alpha=2.2, training__final_alphas=()))  # "() keeps decoding.alpha"
    assert summary["alpha"] == load_checkpoint(workdir, "final", params=False)[1].alpha == 2.2  # was None

    def reached(config, settings, *_, **__):
        raise _Lowered(settings)

    monkeypatch.setattr(exporter, "export_search", reached)
    with pytest.raises(_Lowered) as exported:
        exporter.export_checkpoint(workdir, tmp_path / "export", "final", platforms=("cpu",))
    args = translate.build_parser().parse_args(["--workdir", str(workdir), "--checkpoint", "final"])
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        searched = {
            "translate and evaluate": decoding_flags.decode_settings_from_flags(args, args.max_extra_length).alpha,
            "Translator.from_workdir": checkpoint_settings(workdir, "final", None).alpha,
            "export": exported.value.args[0].alpha,
        }
    # Each searches as the choice was scored: the BLEU it reported is `_Scored`'s at that alpha (was 0.6's).
    assert {name: 10.0 + alpha for name, alpha in searched.items()} == dict.fromkeys(searched, summary["bleu"])
    assert (
        "length penalty alpha 2.2: decoding.alpha, which the run's final choice was scored with (--alpha overrides it)"
        in caplog.messages
    )


def test_a_file_where_the_averages_go_is_one_line_before_any_checkpoint_is_read(run, capsys, monkeypatch):
    from jaxformer.run import averaging

    workdir, _ = run
    averaged = RunDirectory(workdir).averaged
    averaged.write_text("not a folder")
    reads = []
    monkeypatch.setattr(averaging, "averaged_last", lambda *args: reads.append(args))
    code, _, errors = average(workdir, capsys, last=2)
    assert code == 2 and errors == [
        f"error: {averaged} is not a directory, where the averaged checkpoints go: move it away"
    ]
    assert reads == [] and averaged.read_text() == "not a folder"


def test_a_file_at_the_averages_step_is_kept_aside_as_a_replaced_one(run, capsys):
    workdir, params = run
    averaged = RunDirectory(workdir).averaged
    averaged.mkdir()
    (averaged / "20").write_text("a file of mine")
    code = average_checkpoints.main(["--workdir", str(workdir), "--last", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    (aside,) = averaged.glob("20.replaced-*")
    assert aside.read_text() == "a file of mine"
    assert f"moved the previous checkpoint of step 20 to {aside}: a new one replaces it" in err
    step, _, mean = load_checkpoint(workdir, "averaged")
    assert step == 20
    expected = jax.tree.map(lambda leaf: leaf * 1.5, params)  # steps 10 and 20: 1 and 2 times the first
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), mean, expected)


def test_a_second_averaging_of_the_workdir_is_refused_and_the_first_is_written_whole(run, capsys, monkeypatch):
    """Two averagings of one workdir at once: the second, started while the first reads the
    checkpoints, is refused in one line naming the workdir and the first's process, and the first
    writes the whole mean. A training run holding the workdir does not stop either."""
    from jaxformer.run import averaging

    workdir, params = run
    real, second = averaging.averaged_last, []

    def first_reading(*args):
        if not second:  # the first averaging's reading (without the lock the second's would start a third)
            second.append(None)
            second[0] = average(workdir, capsys, last=2)
        return real(*args)

    monkeypatch.setattr(averaging, "averaged_last", first_reading)
    with WorkdirLock(workdir):  # the run training in the workdir
        code, out, errors = average(workdir, capsys, last=2)
    assert (code, errors) == (0, []) and out.startswith("averaged steps [10, 20] into ")
    ((second_code, second_out, second_errors),) = second
    assert second_code == 2 and second_out == "" and len(second_errors) == 1
    assert second_errors[0].startswith(
        f"error: {workdir} is in use by another jaxformer-average-checkpoints: pid {os.getpid()} on host "
    )
    step, _, mean = load_checkpoint(workdir, "averaged")
    assert step == 20 and [path.name for path in RunDirectory(workdir).averaged.iterdir()] == ["20"]
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), mean, jax.tree.map(lambda x: x * 1.5, params)
    )
    assert not RunDirectory(workdir).averaging_lock_file.exists()  # released
