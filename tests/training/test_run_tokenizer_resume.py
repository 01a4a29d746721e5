"""A given tokenizer.model_path file that changed after its run trained: on resume the error
says how to restore the file (a resumed run cannot unset the key); a fine-tuning start may
leave the key unset and take its start's tokenizer."""

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


def sentencepiece_model(sentences, size):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=size, minloglevel=2
    )
    return model.getvalue()


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
    metadata = metadata.replace(tokenizer=Tokenizer.from_sentencepiece_file(given).model_proto)
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
        assert "the file changed after the run trained with it; restore it" in message
        assert f"({workdir.tokenizer_file} holds the checkpoint's conversion of it" in message
        assert "unset" not in message  # a resumed run that unsets the key is refused as a changed config
        # The advice works: the workdir's copy, written over the given file, resumes.
        shutil.copy(workdir.tokenizer_file, given)
        assert tokenizer_for_run(config, workdir, None, saved, resuming=True).source.model_proto == saved[0].tokenizer
    finally:
        given.write_bytes(original)


def test_a_fine_tuning_start_may_leave_the_key_unset(run, tmp_path):
    _, given, original, other, (metadata, _) = run
    start = (metadata, "the fine-tuning start, step 20 of /runs/base/checkpoints")
    given.write_bytes(other)
    try:
        with pytest.raises(CheckpointError) as raised:  # a new workdir: no checkpoint of its own
            tokenizer_for_run(given_config(given), RunDirectory(tmp_path), None, start)
        assert "leave tokenizer.model_path unset to use the model's" in str(raised.value)
    finally:
        given.write_bytes(original)
