"""The workdir's tokenizer against the one stored in the run's newest checkpoint."""

import pathlib

import pytest

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from tests.conftest import make_workdir, read_raw


@pytest.fixture(scope="module")
def tokenizer_run(tmp_path_factory):
    from jaxformer.data.tokenizer import train_tokenizer
    from jaxformer.training import experiment

    workdir, _, tokenizer = make_workdir(tmp_path_factory.mktemp("tokenizer-run"), steps=(20,))
    other = train_tokenizer(read_raw("train.en.gz")[3000:4500] + read_raw("train.de.gz")[3000:4500], vocab_size=500)
    assert other.vocab_size == tokenizer.vocab_size and other.model_proto != tokenizer.model_proto
    config = experiment.default_config()
    config.tokenizer.vocab_size = tokenizer.vocab_size
    return pathlib.Path(workdir), config, tokenizer, other


def test_workdir_tokenizer_is_checked_against_the_checkpoint(tokenizer_run, tmp_path):
    from jaxformer.training.run_tokenizer import tokenizer_for_run

    run, config, tokenizer, other = tokenizer_run
    checkpointer = Checkpointer(RunDirectory(run).checkpoints, keep=None, read_only=True)
    step, metadata = checkpointer.latest_step_metadata()
    checkpointer.close()
    saved = (metadata, f"checkpoint {step} of {checkpointer.directory}")
    path = RunDirectory(tmp_path).tokenizer_file

    tokenizers = tokenizer_for_run(config, RunDirectory(tmp_path), None, saved)
    assert tokenizers.shared and tokenizers.source.model_proto == tokenizer.model_proto
    assert path.read_bytes() == tokenizer.model_proto  # restored from the checkpoint
    assert tokenizer_for_run(config, RunDirectory(tmp_path), None, saved).source.model_proto == tokenizer.model_proto

    other.save(path)  # another valid model of the same size
    with pytest.raises(CheckpointError) as raised:
        tokenizer_for_run(config, RunDirectory(tmp_path), None, saved)
    message = str(raised.value)
    assert str(path) in message and f"checkpoint 20 of {run / 'checkpoints'}" in message
    assert "delete" in message and "\n" not in message

    path.write_bytes(tokenizer.model_proto[: len(tokenizer.model_proto) // 3])  # truncated
    with pytest.raises(CheckpointError) as raised:
        tokenizer_for_run(config, RunDirectory(tmp_path), None, saved)
    assert str(path) in str(raised.value) and "delete it" in str(raised.value)

    path.unlink()
    assert tokenizer_for_run(config, RunDirectory(tmp_path), None, saved).source.model_proto == tokenizer.model_proto
