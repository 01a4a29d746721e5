"""A given tokenizer.model_path file that changed after its run trained, or another file: on
resume the error names the file the run trained with and says how to go on (restore it, or unset
the key and resume with the workdir's copy); a fine-tuning start may leave the key unset and take
its start's tokenizer."""

import io
import shutil

import pytest
import sentencepiece as spm

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.training import experiment
from jaxformer.training.run_tokenizer import tokenizer_for_run
from tests.conftest import make_workdir, read_raw


def sentencepiece_model(sentences, size, model_type="unigram"):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=size, minloglevel=2, model_type=model_type
    )
    return model.getvalue()


# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("run-tokenizer-resume")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A workdir with a checkpoint (step 20) whose tokenizer was converted from given.model; that
    file's original bytes; and another model of the same size."""
    directory = tmp_path_factory.mktemp("given-model-run")
    workdir, _, _ = make_workdir(directory / "run", steps=(20,))
    given = directory / "given.model"
    original = sentencepiece_model(read_raw("train.en.gz", 600), 80)
    given.write_bytes(original)
    checkpointer = Checkpointer(RunDirectory(workdir).checkpoints, keep=None, read_only=True)
    step, metadata = checkpointer.latest_step_metadata()
    checkpointer.close()
    trained_with = {**metadata.config, "tokenizer": {**metadata.config["tokenizer"], "model_path": str(given)}}
    metadata = metadata.replace(tokenizer=Tokenizer.from_sentencepiece_file(given).model_proto, config=trained_with)
    # The run's own copy, as a run writes it: no test may depend on another having written it first
    # (xdist can run any one of them alone on a worker).
    RunDirectory(workdir).tokenizer_file.write_bytes(metadata.tokenizer)
    other = sentencepiece_model(read_raw("train.en.gz")[3000:3600], 80)
    return RunDirectory(workdir), given, original, other, (metadata, f"checkpoint {step} of {checkpointer.directory}")


def given_config(given):
    config = experiment.default_config()
    config.tokenizer.model_path = str(given)
    return config


def test_resume_with_a_changed_model_file_says_how_to_restore_it(run):
    workdir, given, original, other, saved = run
    config = given_config(given)
    assert tokenizer_for_run(config, workdir, None, saved, resuming=True).source.vocab_size == 81
    given.write_bytes(other)  # edited after the run trained with it
    try:
        with pytest.raises(CheckpointError) as raised:
            tokenizer_for_run(config, workdir, None, saved, resuming=True)
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith(f"tokenizer.model_path {given} does not convert to the tokenizer of {saved[1]}")
        assert f"the file changed after the run trained with it (restore it: {workdir.tokenizer_file}, the " in message
        assert message.endswith(
            f"leave tokenizer.model_path unset to resume with the run's own copy ({workdir.tokenizer_file}), or "
            "train in a new workdir"
        )
        # Both ways out work: the key unset (a change a resume may make), and the workdir's copy
        # written over the given file.
        unset = experiment.default_config()
        assert tokenizer_for_run(unset, workdir, None, saved, resuming=True).source.model_proto == saved[0].tokenizer
        shutil.copy(workdir.tokenizer_file, given)
        assert tokenizer_for_run(config, workdir, None, saved, resuming=True).source.model_proto == saved[0].tokenizer
    finally:
        given.write_bytes(original)


def test_resume_with_another_model_file_names_the_one_the_run_trained_with(run, tmp_path):
    """Not 'the file changed, copy the workdir's over it': that would overwrite another model."""
    workdir, given, _, other, saved = run
    another = tmp_path / "another.model"
    another.write_bytes(other)
    with pytest.raises(CheckpointError) as raised:
        tokenizer_for_run(given_config(another), workdir, None, saved, resuming=True)
    message = str(raised.value)
    assert f"the run was trained with tokenizer.model_path={given}; leave tokenizer.model_path unset" in message
    assert "changed" not in message and "copied to" not in message


def test_resume_with_a_model_file_gone_says_the_run_has_its_own_copy(run, tmp_path):
    from jaxformer.data.tokenizer import TokenizerError

    workdir, _, _, _, saved = run
    with pytest.raises(TokenizerError) as raised:
        tokenizer_for_run(given_config(tmp_path / "deleted.model"), workdir, None, saved, resuming=True)
    message = str(raised.value)
    assert "\n" not in message and str(tmp_path / "deleted.model") in message
    assert message.endswith(
        f"the run keeps its own copy of the tokenizer it trained with ({workdir.tokenizer_file}): leave "
        "tokenizer.model_path unset to resume with it"
    )


def test_a_fine_tuning_start_may_leave_the_key_unset(run, tmp_path):
    _, given, original, other, (metadata, _) = run
    start = (metadata, "the fine-tuning start, step 20 of /runs/base/checkpoints")
    given.write_bytes(other)
    try:
        with pytest.raises(CheckpointError) as raised:  # a new workdir: no checkpoint of its own
            tokenizer_for_run(given_config(given), RunDirectory(tmp_path), None, start)
        assert "leave tokenizer.model_path unset to fine-tune with the start's tokenizer" in str(raised.value)
    finally:
        given.write_bytes(original)


def test_subword_sampling_with_a_given_bpe_model_is_refused_before_the_data(run, tmp_path):
    """The pipeline would refuse it too, after the whole corpus had been prepared."""
    from jaxformer.data.tokenizer import TokenizerError
    from jaxformer.training.run_tokenizer import check_given_models

    workdir, _, _, _, saved = run
    bpe = tmp_path / "bpe.model"
    bpe.write_bytes(sentencepiece_model(read_raw("train.en.gz", 600), 80, model_type="bpe"))
    config = given_config(bpe)
    config.tokenizer.sampling_nbest, config.tokenizer.sampling_alpha = 4, 0.5
    with pytest.raises(TokenizerError) as raised:
        check_given_models(config, RunDirectory(tmp_path / "new"), None)
    assert str(raised.value) == (
        f"config tokenizer.sampling_nbest=4: subword sampling needs a unigram sentencepiece model, and "
        f"tokenizer.model_path {bpe} is a bpe model (set sampling_nbest=0)"
    )
    check_given_models(given_config(bpe), RunDirectory(tmp_path / "new"), None)  # no sampling: fine
    unigram = given_config(workdir.tokenizer_file)
    unigram.tokenizer.sampling_nbest = 4
    check_given_models(unigram, workdir, saved, resuming=True)  # a unigram model samples


def test_a_swapped_workdir_tokenizer_is_refused_before_the_data(run, tmp_path, monkeypatch):
    """Another sentencepiece model copied over the workdir's tokenizer.model, then the same command:
    refused before any data is prepared (the run's data_dir is never made), not after hours of it."""
    from jaxformer.training import run_start

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared before the workdir's tokenizer was checked")

    monkeypatch.setattr(run_start, "builder_for_run", no_data)
    monkeypatch.setattr(run_start, "prepare_data", no_data)
    workdir = RunDirectory(shutil.copytree(run[0], tmp_path / "run"))
    checkpointer = Checkpointer(workdir.checkpoints, keep=None, read_only=True)
    step, metadata = checkpointer.latest_step_metadata()
    checkpointer.close()
    # The module's workdir holds a conversion of given.model; its checkpoint, the tokenizer make_workdir trained.
    assert workdir.tokenizer_file.read_bytes() != metadata.tokenizer
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.tokenizer.vocab_size = metadata.config["tokenizer"]["vocab_size"]
    config.data.data_dir = str(tmp_path / "tfds")
    with pytest.raises(CheckpointError) as raised:
        run_start.prepare_run(config, workdir.path)
    assert str(raised.value) == (
        f"{workdir.tokenizer_file} is not the tokenizer stored in checkpoint {step} of {workdir.checkpoints}, "
        f"which the model was trained with; delete {workdir.tokenizer_file} to restore it from the checkpoint, "
        "or train in a new workdir"
    )
    assert not (tmp_path / "tfds").exists()


def test_a_tokenizer_an_earlier_start_left_is_not_called_a_changed_model_file(run, tmp_path):
    """A start that trained, or converted another model, and stopped before its first checkpoint
    left its tokenizer.model; a start given tokenizer.model_path then was told that the file it gave
    "has changed". It is told what the workdir's file is, before any data is prepared, and the file
    is left as it was (a start that removes it converts the model given)."""
    from jaxformer.training.run_tokenizer import check_given_models

    workdir, given, _, other, _ = run
    left = RunDirectory(tmp_path / "stopped")
    left.path.mkdir()
    shutil.copy(workdir.tokenizer_file, left.tokenizer_file)  # given.model's conversion, as a start leaves it
    another = tmp_path / "another.model"
    another.write_bytes(other)
    config = given_config(another)
    for check in (lambda: check_given_models(config, left, None), lambda: tokenizer_for_run(config, left, None, None)):
        with pytest.raises(CheckpointError) as raised:
            check()
        assert str(raised.value) == (
            f"tokenizer.model_path {another} does not convert to {left.tokenizer_file}, a tokenizer no checkpoint "
            "of the workdir was made with (left by an earlier start that saved none, which trained its own "
            "tokenizer or converted another model, or this one before it changed); delete it to convert "
            "tokenizer.model_path there, or use a new workdir"
        )
        assert left.tokenizer_file.read_bytes() == workdir.tokenizer_file.read_bytes()  # left as it was
    check_given_models(given_config(given), left, None)  # the model it was converted from: used
    left.tokenizer_file.unlink()
    assert tokenizer_for_run(config, left, None, None).source.model_proto == left.tokenizer_file.read_bytes()
