"""What a resumed training run refuses at its start, before any data is prepared: a file at a
finished run's best/ or final/, a tokenizer file it cannot restore, a resume whose validation BLEU
would be measured otherwise than the score best/ keeps, one that would set an averaged/ step
aside while an averaging runs, or a mesh that does not divide its model; and what a decoding key
it settles reads as when left None. A new run's output paths: test_run_output_paths.py."""

import copy
import dataclasses
import logging
import os
import re
import shutil
import types

import ml_collections
import pytest

from jaxformer.commands import train
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.errors import EXIT_USER_ERROR, CheckpointError, UserError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.lock import AveragingLock, WorkdirLockedError
from jaxformer.training import experiment, final_choice, resume_rules, run_start, validation_bleu
from jaxformer.training.sharding import MeshError
from tests.conftest import make_workdir

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("run-start-checks")


@pytest.fixture(scope="module")
def finished_template(tmp_path_factory):
    """A run with checkpoints 10 and 20, and best/ holding step 10 with BLEU 5 (greedy, on 16 pairs)."""
    workdir, params, _ = make_workdir(tmp_path_factory.mktemp("finished") / "run", steps=(10, 20))
    metadata = load_checkpoint(workdir, 20, params=False)[1]
    config = copy.deepcopy(metadata.config)
    config["training"].update(bleu_every_steps=10, bleu_examples=16, bleu_method="greedy", num_train_steps=20)
    best = Checkpointer(RunDirectory(workdir).best, keep=1)
    best.save_params(10, params, metadata.replace(step=10, bleu=5.0, config=config))
    best.close()
    return workdir


@pytest.fixture
def finished(finished_template, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished_template, workdir)
    return workdir


def best_measured_with(workdir, edit) -> dict:
    """best/'s checkpoint saved again with its config changed by `edit` (in place); that config."""
    _, metadata, params = load_checkpoint(workdir, "best")
    config = copy.deepcopy(metadata.config)
    edit(config)
    best_folder = RunDirectory(workdir).best
    shutil.rmtree(best_folder)
    best = Checkpointer(best_folder, keep=1)
    best.save_params(metadata.step, params, metadata.replace(config=config))
    best.close()
    return config


def config_of(workdir, **training):
    """best/'s config (the run's, with its BLEU settings), its `training` keys changed."""
    config = ml_collections.ConfigDict(load_checkpoint(workdir, "best", params=False)[1].config)
    for key, value in training.items():
        config.training[key] = value
    return config


@pytest.mark.parametrize("kind", ["folder", "link into no folder"])
def test_a_resumed_run_refuses_only_a_tokenizer_file_it_cannot_restore(kind, finished, no_data):
    """A folder is named, as before, with the checkpoint that restores the file; a link into no
    folder was a FileNotFoundError traceback once the data was prepared."""
    path = RunDirectory(finished).tokenizer_file  # restored from checkpoint 20 where none is there
    path.mkdir() if kind == "folder" else path.symlink_to(finished / "gone" / path.name)
    refusal = "cannot read the tokenizer .*: Is a directory; delete it to restore it from checkpoint 20 of "
    if kind != "folder":
        refusal = "is a link to .*, in a folder that does not exist, where the run saves its tokenizer: move it away"
    with pytest.raises(UserError, match=refusal):
        run_start.prepare_run(config_of(finished, num_train_steps=40), finished)


@pytest.mark.parametrize("folder", ["best", "final"])
def test_a_file_in_a_finished_run_is_refused_not_dropped_from_the_candidates(folder, finished, no_data):
    config = config_of(finished, final_choice=True)
    if folder == "best":
        shutil.rmtree(finished / folder)
    (finished / folder).write_text("junk")
    with pytest.raises(CheckpointError, match=f"{finished / folder} is not a directory"):
        run_start.prepare_run(config, finished)
    # and where the choice is made from Python, before any candidate is scored
    tokenizers = types.SimpleNamespace(source=None, target=None)
    with pytest.raises(CheckpointError, match=f"{finished / folder} is not a directory"):
        final_choice.choose_final(config, None, tokenizers, None, RunDirectory(finished), 20, None, None)


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"bleu_examples": 4}, "training.bleu_examples=16 (now 4)"),
        ({"bleu_method": "beam"}, "training.bleu_method='greedy' (now 'beam')"),
        ({"bleu_method": None}, "training.bleu_method='greedy' (now None)"),  # decoding.method is beam
        ({"bleu_tokenize": "char"}, "training.bleu_tokenize='13a' (now 'char')"),  # None: 13a, for German
    ],
)
def test_a_resume_measuring_bleu_otherwise_than_best_is_refused(changes, named, finished, no_data):
    config = config_of(finished, num_train_steps=40, **changes)
    best = RunDirectory(finished).best
    with pytest.raises(UserError) as refused:
        run_start.prepare_run(config, finished)
    message = str(refused.value)
    assert message == (
        f"the validation BLEU 5.00 of {best / '10'}, which new scores are compared with, was measured with {named}: "
        f"restore the setting it was measured with, or move {best} aside (e.g. to {best}.before) to keep the best "
        "by the new measure"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"num_train_steps": 20, "bleu_examples": 4},  # trains no further: no BLEU to compare
        {"num_train_steps": 40, "bleu_every_steps": 0, "bleu_examples": 4},  # no BLEU at all
        {"num_train_steps": 40},  # measured alike ...
        {"num_train_steps": 40, "bleu_tokenize": "13a"},  # ... the tokenizer None gives German named
        {"num_train_steps": 40, "batch_size": None},  # ... what greedy search does not read may change
    ],
)
def test_a_resume_measuring_alike_or_not_at_all_goes_on(changes, finished, no_data):
    config = config_of(finished, **{key: value for key, value in changes.items() if key != "batch_size"})
    if "batch_size" in changes:
        config.decoding.beam_size, config.decoding.alpha, config.decoding.batch_size = 2, 1.0, 7
    with pytest.raises(pytest.fail.Exception, match="the data was prepared"):  # past the checks
        run_start.prepare_run(config, finished)


@pytest.mark.parametrize("newest", ["kept", "damaged"])
def test_a_best_step_the_resumed_run_sets_aside_is_not_compared(newest, finished, no_data):
    """best/ holds only a step after the checkpoint the run resumes from, measured with 16 pairs:
    step 30 (the segment that scored it was killed before checkpoint 30), or step 20 where
    checkpoint 20's metadata is damaged (the run resumes from 10). The run sets it aside before it
    validates (run/rolled_back.py), so a resume measuring with 4 pairs goes on; a best/ step it
    keeps is still compared (test_a_resume_measuring_bleu_otherwise_than_best_is_refused)."""
    config = config_of(finished, num_train_steps=40, bleu_examples=4)
    best_step = 30 if newest == "kept" else 20
    _, metadata, params = load_checkpoint(finished, "best")
    run = RunDirectory(finished)
    shutil.rmtree(run.best)
    best = Checkpointer(run.best, keep=1)
    best.save_params(best_step, params, metadata.replace(step=best_step))
    best.close()
    if newest == "damaged":
        Checkpointer(run.checkpoints, keep=None, read_only=True).metadata_file(20).write_text("{")
    with pytest.raises(pytest.fail.Exception, match="the data was prepared"):  # past the checks
        run_start.prepare_run(config, finished)
    assert [path.name for path in run.best.iterdir()] == [str(best_step)]  # set aside by the loop, not here


def test_best_with_unreadable_metadata_is_left_to_the_validator(finished, no_data, caplog):
    Checkpointer(RunDirectory(finished).best, keep=None, read_only=True).metadata_file(10).write_text("{")
    config = ml_collections.ConfigDict(load_checkpoint(finished, 20, params=False)[1].config)
    config.training.update(bleu_every_steps=10, bleu_examples=4, num_train_steps=40)
    with caplog.at_level(logging.WARNING), pytest.raises(pytest.fail.Exception, match="the data was prepared"):
        run_start.prepare_run(config, finished)
    assert any("cannot read the metadata of checkpoint 10" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("averaged_step, refused", [(30, True), (20, False)])
def test_an_averaged_step_to_set_aside_while_an_averaging_runs_is_refused_before_any_work(
    averaged_step, refused, finished, no_data
):
    """averaged/30, after checkpoint 20 (checkpoint 30 removed), is set aside whichever checkpoint
    restores, holding averaged.lock: while jaxformer-average-checkpoints holds it, the resume is
    refused now, not once the data is prepared and the state restored. averaged/20 moves only
    where checkpoint 20's arrays prove damaged: the run goes on."""
    run = RunDirectory(finished)
    _, metadata, params = load_checkpoint(finished, 20)
    averaged = Checkpointer(run.averaged, keep=None)
    averaged.save_params(averaged_step, params, metadata.replace(step=averaged_step))
    averaged.close()
    config = config_of(finished, num_train_steps=40)
    with AveragingLock(finished):
        if not refused:
            with pytest.raises(pytest.fail.Exception, match="the data was prepared"):
                run_start.prepare_run(config, finished)
            return
        with pytest.raises(WorkdirLockedError) as refusal:
            run_start.prepare_run(config, finished)
    assert str(refusal.value).startswith(
        f"cannot set aside step(s) 30 of {run.averaged}, after step 20, the newest checkpoint this run can resume "
        f"from: {finished} is in use by another jaxformer-average-checkpoints: pid {os.getpid()} "
    )
    assert sorted(path.name for path in run.averaged.iterdir()) == ["30"]  # nothing moved
    with pytest.raises(pytest.fail.Exception, match="the data was prepared"):  # the averaging done: goes on
        run_start.prepare_run(config, finished)


@pytest.mark.parametrize(
    "num_train_steps, keep, lost, when",
    [
        # 20, which the run resumes from, is not named: moved aside, the run would resume from 10.
        (40, 1, "10", "its next checkpoint"),
        (40, 2, "10", "its next checkpoint"),
        (20, 1, "10", "its end (it trains no further)"),
    ],
)
def test_a_resume_keeping_fewer_checkpoints_than_the_run_kept_is_refused(
    num_train_steps, keep, lost, when, finished, no_data
):
    """Orbax deleted, at the first save, the checkpoints beyond a lowered training.keep_checkpoints
    (the run's end, those beyond it), which the run had kept for averaging: refused, nothing lost."""
    checkpoints = RunDirectory(finished).checkpoints
    config = config_of(finished, num_train_steps=num_train_steps, keep_checkpoints=keep)
    with pytest.raises(CheckpointError) as refused:
        run_start.prepare_run(config, finished)
    first = checkpoints / lost.split(",")[0]
    assert str(refused.value) == (
        f"training.keep_checkpoints={keep}, lowered from the run's 3: {when} would delete checkpoint {lost} of "
        f"{checkpoints}, which it keeps for averaging; restore training.keep_checkpoints=3, or move those aside "
        f"yourself (e.g. {first} to {first}.kept) to keep fewer"
    )
    assert sorted(path.name for path in checkpoints.iterdir()) == ["10", "20"]
    for step in lost.split(", "):  # the way on it names: then the lower keep goes on
        (checkpoints / step).rename(checkpoints / f"{step}.kept")
    with pytest.raises(pytest.fail.Exception, match="the data was prepared"):
        run_start.prepare_run(config, finished)


@pytest.mark.parametrize("num_train_steps, keep", [(40, 5), (20, 2)])  # more kept; fewer, none of those there lost
def test_a_resume_keeping_another_number_that_loses_nothing_goes_on(num_train_steps, keep, finished, no_data):
    config = config_of(finished, num_train_steps=num_train_steps, keep_checkpoints=keep)
    with pytest.raises(pytest.fail.Exception, match="the data was prepared"):
        run_start.prepare_run(config, finished)


@pytest.mark.parametrize("language, named", [("de", None), ("ja", "training.bleu_tokenize='13a' (now 'ja-mecab')")])
def test_a_best_scored_before_the_tokenizer_key_was_scored_with_13a(language, named, finished):
    """A best/ from before training.bleu_tokenize: 13a whatever the language, which a Japanese
    run now leaves for ja-mecab (its old scores all 0.00)."""
    run = RunDirectory(finished)

    def before_the_key(config):
        config["data"]["target_language"] = language
        del config["training"]["bleu_tokenize"]

    now = ml_collections.ConfigDict(best_measured_with(finished, before_the_key))
    now.training.bleu_tokenize, now.training.num_train_steps = None, 40
    if named is None:
        validation_bleu.check_best_measured_alike(now, run, 20)
        return
    with pytest.raises(UserError, match=f"was measured with {re.escape(named)}: restore the setting"):
        validation_bleu.check_best_measured_alike(now, run, 20)


@pytest.mark.parametrize("bleu_method", ["beam", "greedy"])
@pytest.mark.parametrize(
    ("key", "value", "measured"),
    [
        ("length_penalty", "transformers", "'gnmt'"),
        ("stop", "exact", "'current_length'"),
        ("renormalize_after_bans", True, "False"),
    ],
)
def test_a_resume_changing_a_beam_setting_is_refused_where_the_search_reads_it(
    bleu_method, key, value, measured, finished, no_data
):
    """best/ measured with gnmt's length penalty (its config's None, as the run's start settles
    it) and the default stop rule: transformers' penalty ranks beam search's hypotheses otherwise
    and another stop rule ends them elsewhere, so two measures would compete for best/; greedy
    search reads neither."""
    best_measured_with(finished, lambda config: config["training"].update(bleu_method=bleu_method))
    config = config_of(finished, num_train_steps=40)
    config.decoding[key] = value
    if bleu_method == "greedy":
        with pytest.raises(pytest.fail.Exception, match="the data was prepared"):  # past the checks
            run_start.prepare_run(config, finished)
        return
    with pytest.raises(UserError) as refused:
        run_start.prepare_run(config, finished)
    best = RunDirectory(finished).best
    assert str(refused.value) == (
        f"the validation BLEU 5.00 of {best / '10'}, which new scores are compared with, was measured with "
        f"decoding.{key}={measured} (now {value!r}): restore the setting it was measured with, or move "
        f"{best} aside (e.g. to {best}.before) to keep the best by the new measure"
    )


@pytest.mark.parametrize("start", ["resumed", "fine-tuned"])
def test_a_mesh_that_does_not_divide_a_resumed_or_fine_tuned_model_is_refused_before_the_data(
    start, finished, tmp_path, no_data
):
    """A resumed run (which may read its data from a new data.data_dir) or one fine-tuned from it
    under a mesh that its 4 heads do not divide was refused only once its data was prepared."""
    config = config_of(finished)
    config.mesh.shape = (1, 1, 8)
    workdir = finished
    if start == "fine-tuned":
        config.training.init_from, workdir = str(finished), tmp_path / "tuned"
    with pytest.raises(MeshError, match=r"^mesh.shape=\(1, 1, 8\): model.num_heads=4 is not divisible by its mesh"):
        run_start.prepare_run(config, workdir)


def test_a_bleu_tokenizer_that_cannot_be_built_is_one_line_before_any_work(tmp_path, capsys, no_data, monkeypatch):
    monkeypatch.setattr("sacrebleu.tokenizers.tokenizer_ja_mecab.MeCab", None)  # as without the ja extra
    workdir = tmp_path / "run"
    argv = ["--config", "tiny", "--workdir", str(workdir), "--config.data.target_language=ja"]
    assert train.main([*argv, "--config.training.bleu_every_steps=20"]) == EXIT_USER_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: config training.bleu_tokenize=None: BLEU of target language 'ja' is scored with sacreBLEU's "
        "'ja-mecab' tokenizer, which cannot be built here"
    )
    assert errors[0].endswith("or name another tokenizer with --config.training.bleu_tokenize (e.g. 'char')")
    assert not workdir.exists()


def test_each_inherited_decoding_key_left_none_reads_as_its_decode_settings_default_everywhere():
    """None means the value before the key existed, which resume_rules.INHERITED_DECODING alone
    says: for the run's start, the search validation BLEU and the final choice run, the settings
    best/ and the final choice were measured with (a saved config's key None or absent alike), and
    the resume's comparison (SETTLED_AT_START, made from it)."""
    defaults = {field.name: field.default for field in dataclasses.fields(DecodeSettings)}
    for key in resume_rules.INHERITED_DECODING:
        config = experiment.default_config()
        assert config.decoding[key] is None
        saved = config.to_dict()
        absent = copy.deepcopy(saved)
        del absent["decoding"][key]
        read = {
            "decode_settings": getattr(validation_bleu.decode_settings(config), key),
            "bleu_settings": validation_bleu.bleu_settings(saved)[f"decoding.{key}"],
            "bleu_settings, absent": validation_bleu.bleu_settings(absent)[f"decoding.{key}"],
        }
        run_start.settle_inherited_decoding(config, None, None)
        read["settle_inherited_decoding"] = config.decoding[key]
        # A checkpoint saves the settled value, which a resume whose config still says None agrees with.
        differences = resume_rules.resume_differences(config.to_dict(), experiment.default_config(), sections=None)
        assert not [difference for difference in differences if difference.startswith(f"decoding.{key}:")]
        for place, value in read.items():
            assert (value, type(value)) == (defaults[key], type(defaults[key])), (key, place)
