"""The workdir's tokenizer against the one stored in the run's newest checkpoint."""

import pathlib

import pytest

from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from tests.conftest import make_workdir, read_raw

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("run-tokenizer")


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


class CountingSource:
    """Records {"en": "e<i>", "de": "d<i>"}, remembering which were read."""

    def __init__(self, size):
        self.size, self.read = size, []

    def __len__(self):
        return self.size

    def __getitems__(self, indices):
        self.read.extend(indices)
        return [{"en": f"e{i}", "de": f"d{i}"} for i in indices]


def test_beyond_max_sentences_only_a_seeded_sample_of_records_is_read():
    from jaxformer.training.run_tokenizer import _sentences

    small = CountingSource(100)
    assert list(_sentences(small, ["en", "de"], max_sentences=200)) == [
        f"{side}{i}" for i in range(100) for side in "ed"
    ]
    large = CountingSource(10_000)
    sentences = list(_sentences(large, ["en", "de"], max_sentences=1001))
    assert len(sentences) == 1000 and len(large.read) == 500 == len(set(large.read))  # only the sample is read
    assert large.read == sorted(large.read) and max(large.read) > 5000  # drawn across the corpus, in order
    assert sentences == [f"{side}{i}" for i in large.read for side in "ed"]
    again = CountingSource(10_000)
    assert list(_sentences(again, ["en", "de"], max_sentences=1001)) == sentences  # seeded: the same sample


def test_a_tokenizer_no_checkpoint_vouches_for_is_used_only_if_the_config_trains_it(tokenizer_run, tmp_path, caplog):
    """Left by an earlier start of the workdir that wrote no checkpoint: the same config on the same
    data trains the same model, so it is reused; another one (other data, a failed fine-tuning's)
    is refused, not used unannounced."""
    import logging

    from jaxformer.training.run_tokenizer import tokenizer_for_run

    _, config, _, other = tokenizer_run
    config = config.copy_and_resolve_references()  # the module's config stays as it was
    records = [
        {"en": en.encode(), "de": de.encode()}
        for en, de in zip(read_raw("train.en.gz", 1500), read_raw("train.de.gz", 1500))
    ]
    config.tokenizer.vocab_size = other.vocab_size
    first = tokenizer_for_run(config, RunDirectory(tmp_path), records, None).source
    path = RunDirectory(tmp_path).tokenizer_file
    assert path.read_bytes() == first.model_proto
    with caplog.at_level(logging.INFO):
        again = tokenizer_for_run(config, RunDirectory(tmp_path), records, None).source
    assert again.model_proto == first.model_proto and f"{path} is the tokenizer this config trains" in caplog.text

    other.save(path)
    with pytest.raises(CheckpointError) as raised:
        tokenizer_for_run(config, RunDirectory(tmp_path), records, None)
    message = str(raised.value)
    assert (
        message.startswith(f"{path} is not the tokenizer this config trains on the en+de text") and "\n" not in message
    )
    assert path.read_bytes() == other.model_proto  # left as it was


def test_a_tokenizer_that_cannot_spell_a_side_is_warned_about(caplog):
    import logging

    from jaxformer.data.tokenizer import train_tokenizer
    from jaxformer.training import experiment
    from jaxformer.training.run_tokenizer import RunTokenizers, log_unknown_rate

    english, german = read_raw("train.en.gz", 1500), read_raw("train.de.gz", 1500)
    records = [{"en": en.encode(), "de": de.encode()} for en, de in zip(english, german)]
    config = experiment.default_config()
    for text, warned in ((english + german, False), (english, True)):  # an English-only model has no umlauts
        tokenizer = train_tokenizer(text, vocab_size=500)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            log_unknown_rate(config, RunTokenizers(tokenizer, tokenizer), records)
        (info,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("<unk> pieces on 1500")]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert info.startswith("<unk> pieces on 1500 training pairs: en 0.00%, de ")
        if warned:
            (warning,) = warnings
            assert "of the de side's pieces are <unk> on 1500 training pairs" in warning
        else:
            assert warnings == []


def test_a_fine_tuning_start_names_its_tokenizer_when_the_config_disagrees(tokenizer_run, tmp_path, caplog):
    import io
    import logging

    import sentencepiece as spm

    from jaxformer.training.run_tokenizer import check_given_models, tokenizer_for_run

    run, config, tokenizer, _ = tokenizer_run
    config = config.copy_and_resolve_references()  # the module's config stays as it was
    checkpointer = Checkpointer(RunDirectory(run).checkpoints, keep=None, read_only=True)
    _, metadata = checkpointer.latest_step_metadata()
    checkpointer.close()
    where = f"the fine-tuning start, {run}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config.tokenizer.vocab_size = 400  # the start's tokenizer (its embeddings') replaces it, with a note
    with caplog.at_level(logging.INFO):
        tokenizers = tokenizer_for_run(config, RunDirectory(tmp_path / "a"), None, (metadata, where))
    assert tokenizers.source.model_proto == tokenizer.model_proto
    assert (
        f"the tokenizer of {where} has {tokenizer.vocab_size} pieces: it replaces tokenizer.vocab_size=400"
        in caplog.text
    )
    model = io.BytesIO()  # another sentencepiece model, given as tokenizer.model_path
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(read_raw("train.en.gz", 800)), model_writer=model, vocab_size=300, minloglevel=2
    )
    (tmp_path / "other.model").write_bytes(model.getvalue())
    config.tokenizer.vocab_size = tokenizer.vocab_size
    config.tokenizer.model_path = str(tmp_path / "other.model")
    with pytest.raises(CheckpointError, match=rf"other.model does not convert to the tokenizer of {where}, which"):
        tokenizer_for_run(config, RunDirectory(tmp_path / "b"), None, (metadata, where))
    # The same refusal before any data is prepared (run_start), writing nothing; the start's own model passes.
    (tmp_path / "c").mkdir()
    with pytest.raises(CheckpointError, match=rf"other.model does not convert to the tokenizer of {where}, which"):
        check_given_models(config, RunDirectory(tmp_path / "c"), (metadata, where))
    assert not any((tmp_path / "c").iterdir())
    tokenizer.save(tmp_path / "same.model")
    config.tokenizer.model_path = str(tmp_path / "same.model")
    check_given_models(config, RunDirectory(tmp_path / "c"), (metadata, where))


def test_a_fine_tuning_start_refusing_a_given_model_says_what_the_start_was_trained_with(tokenizer_run, tmp_path):
    """tokenizer.model_path beside training.init_from, not the start's tokenizer: the error names the
    tokenizer the start's run was trained with, read from its config, and says "restore it" only
    where the file given is the one the start converted (it told the user to restore a file the
    start never read)."""
    import dataclasses

    from jaxformer.training.run_tokenizer import check_given_models

    run, config, _, other = tokenizer_run
    config = config.copy_and_resolve_references()
    checkpointer = Checkpointer(RunDirectory(run).checkpoints, keep=None, read_only=True)
    _, metadata = checkpointer.latest_step_metadata()
    checkpointer.close()
    where = f"the fine-tuning start, {run}"
    given = tmp_path / "mine.model"
    other.save(given)
    config.tokenizer.model_path = str(given)
    start_trained_with = {  # the start's tokenizer.model_path -> why the error gives
        None: "the start trained its own tokenizer (tokenizer.model_path was unset)",
        "/corpus/spm.model": "the start was trained with tokenizer.model_path=/corpus/spm.model",
        str(given): "the file changed after the start trained with it (restore it)",
    }
    for trained_with, why in start_trained_with.items():
        start_config = {**metadata.config, "tokenizer": {**metadata.config["tokenizer"], "model_path": trained_with}}
        start = (dataclasses.replace(metadata, config=start_config), where)
        with pytest.raises(CheckpointError) as raised:
            check_given_models(config, RunDirectory(tmp_path / "new"), start)
        assert str(raised.value) == (
            f"tokenizer.model_path {given} does not convert to the tokenizer of {where}, which the model was "
            f"trained with: {why}; leave tokenizer.model_path unset to fine-tune with the start's tokenizer, "
            "or start from another run"
        )
