"""Tokenizer options: a sentencepiece model trained elsewhere (tokenizer.model_path), converted to
jaxformer's special ids, and separate source and target vocabularies with untied embeddings
(tokenizer.separate_vocabularies), from the converter up to a run of train.py and translation
(separate vocabularies' model, tokenizers, pipeline and translator short of a run:
test_separate_vocabularies.py)."""

import io
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from jaxformer.data.tokenizer import Tokenizer, TokenizerError, train_tokenizer, with_jaxformer_ids
from jaxformer.errors import CheckpointError
from jaxformer.model.config import ConfigError
from jaxformer.run.directory import RunDirectory
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from jaxformer.training import experiment
from tests.conftest import read_raw
from tests.xla_flags import xla_flags

ROOT = pathlib.Path(__file__).parents[2]
SPECIAL_PIECES = ["<pad>", "</s>", "<unk>", "<s>"]
ENGLISH, GERMAN = read_raw("train.en.gz", 8000), read_raw("train.de.gz", 8000)
TRAIN_TEXT = ENGLISH[:2000] + GERMAN[:2000]
HELD_OUT = ENGLISH[5000:8000] + GERMAN[5000:8000]  # text the models were not trained on: some unknown pieces


def default_id_model(sentences, vocab_size, model_type="unigram", **options) -> bytes:
    """A model as sentencepiece trains it by default (unk 0, bos 1, eos 2, no pad) unless `options` say otherwise."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        minloglevel=2,
        **options,
    )
    return model.getvalue()


def pieces_by_name(model_proto: bytes) -> dict[str, tuple[float, int]]:
    model = model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    return {piece.piece: (piece.score, piece.type) for piece in model.pieces}


@pytest.fixture(scope="module")
def default_models():
    return {model_type: default_id_model(TRAIN_TEXT, 400, model_type) for model_type in ("unigram", "bpe")}


# -- converting a model trained elsewhere ------------------------------------------------------


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_converted_model_splits_text_into_the_same_pieces(default_models, model_type):
    original = spm.SentencePieceProcessor(model_proto=default_models[model_type])
    assert (original.unk_id(), original.bos_id(), original.eos_id(), original.pad_id()) == (0, 1, 2, -1)
    converted = Tokenizer(with_jaxformer_ids(default_models[model_type]))
    assert converted.vocab_size == original.get_piece_size() + 1  # <pad> added
    assert converted.pieces([PAD_ID, EOS_ID, UNK_ID, BOS_ID]) == SPECIAL_PIECES

    original_ids = original.encode(HELD_OUT)
    converted_ids = converted.encode(HELD_OUT, add_eos=False)
    unknown = 0
    for text, expected, ids in zip(HELD_OUT, original_ids, converted_ids):
        assert converted.pieces(ids) == [original.id_to_piece(i) for i in expected], text
        assert [i == UNK_ID for i in ids] == [i == original.unk_id() for i in expected], text
        unknown += int(np.sum(ids == UNK_ID))
        assert converted.decode(np.append(ids, EOS_ID)) == original.decode(expected), text
    assert unknown > 0  # the held-out text exercises the moved <unk>
    round_trips = sum(converted.decode(ids) == text for text, ids in zip(HELD_OUT, converted.encode(HELD_OUT)))
    assert round_trips > 0.9 * len(HELD_OUT)  # the rest hold characters the small vocabulary lacks

    before, after = pieces_by_name(default_models[model_type]), pieces_by_name(converted.model_proto)
    assert {name: after[name] for name in before} == before  # every piece kept with its score and type
    assert set(after) - set(before) == {"<pad>"}
    assert with_jaxformer_ids(converted.model_proto) == converted.model_proto  # converting twice changes nothing


def test_other_special_layouts_convert():
    # <pad> present (at 3), <s> absent: <s> is added, <pad> moved
    proto = default_id_model(TRAIN_TEXT, 300, "bpe", unk_id=0, eos_id=1, pad_id=3, bos_id=2, bos_piece="<bos>")
    original = spm.SentencePieceProcessor(model_proto=proto)
    converted = Tokenizer(with_jaxformer_ids(proto))
    assert converted.pieces([PAD_ID, EOS_ID, UNK_ID, BOS_ID]) == ["<pad>", "</s>", "<unk>", "<bos>"]
    assert converted.vocab_size == original.get_piece_size()
    for text, expected, ids in zip(HELD_OUT[:500], original.encode(HELD_OUT[:500]), converted.encode(HELD_OUT[:500])):
        assert converted.pieces(ids[:-1]) == [original.id_to_piece(i) for i in expected], text

    no_bos = default_id_model(TRAIN_TEXT, 300, "bpe", bos_id=-1)
    converted = Tokenizer(with_jaxformer_ids(no_bos))
    assert converted.pieces([PAD_ID, EOS_ID, UNK_ID, BOS_ID]) == SPECIAL_PIECES
    assert converted.vocab_size == spm.SentencePieceProcessor(model_proto=no_bos).get_piece_size() + 2

    jaxformer_model = train_tokenizer(TRAIN_TEXT, 300, "bpe")
    assert with_jaxformer_ids(jaxformer_model.model_proto) == jaxformer_model.model_proto


def test_a_special_piece_of_the_wrong_type_is_refused(tmp_path):
    """A model whose pad is a USER_DEFINED piece is refused as such; one with no pad (pad_id=-1, as
    sentencepiece trains by default) that has '<pad>', the name the converter would give the pad it
    adds, as an ordinary piece is refused as that, with a remedy that converts."""
    text = TRAIN_TEXT[:500]
    path = tmp_path / "user_pad.model"
    path.write_bytes(default_id_model(text, 100, "bpe", user_defined_symbols=["<pad>"]))
    with pytest.raises(TokenizerError) as raised:
        Tokenizer.from_sentencepiece_file(path)
    assert str(raised.value) == (
        f"the sentencepiece model {path} is unusable: the sentencepiece model has no pad id (pad_id=-1) and uses "
        "'<pad>' as an ordinary USER_DEFINED piece, but the converter needs that name (its pad_piece) for the pad it "
        "adds: train it with another pad_piece (e.g. --pad_piece='[PAD]') or without '<pad>' in user_defined_symbols"
    )
    no_bos = default_id_model(text, 100, "bpe", user_defined_symbols=["<s>"], bos_id=-1)
    with pytest.raises(
        TokenizerError, match=r"^the sentencepiece model has no bos id \(bos_id=-1\) and uses '<s>' as an ordinary "
    ):
        with_jaxformer_ids(no_bos)
    user_pad = default_id_model(text, 100, "bpe", user_defined_symbols=["<pad>"], pad_id=3)  # its pad is USER_DEFINED
    with pytest.raises(TokenizerError, match=r"^the pad piece '<pad>' of the sentencepiece model is a USER_DEFINED "):
        with_jaxformer_ids(user_pad)

    # The remedy the message gives converts, and '<pad>' stays a piece of the text.
    converted = Tokenizer(
        with_jaxformer_ids(default_id_model(text, 100, "bpe", user_defined_symbols=["<pad>"], pad_piece="[PAD]"))
    )
    assert converted.pieces([PAD_ID]) == ["[PAD]"]
    assert "<pad>" in converted.pieces(converted.encode(["a <pad> b"])[0])


def test_files_that_are_not_sentencepiece_models_are_named(tmp_path, default_models):
    cases = {
        "notes.txt": b"A sentencepiece model is a protobuf.\n",
        "random.model": np.random.default_rng(0).bytes(500),
        "empty.model": b"",
        "truncated.model": default_models["unigram"][: len(default_models["unigram"]) // 2],
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(TokenizerError) as raised:
            Tokenizer.from_sentencepiece_file(path)
        message = str(raised.value)
        assert str(path) in message and "\n" not in message, message
    with pytest.raises(TokenizerError, match="cannot read the sentencepiece model .*missing.model"):
        Tokenizer.from_sentencepiece_file(tmp_path / "missing.model")
    path = tmp_path / "good.model"
    path.write_bytes(default_models["bpe"])
    assert Tokenizer.from_sentencepiece_file(path).model_proto == with_jaxformer_ids(default_models["bpe"])


# -- the experiment config ----------------------------------------------------------------------


def tiny_config():
    spec_path = ROOT / "jaxformer" / "configs" / "tiny.py"
    if not spec_path.exists():
        spec_path = ROOT / "configs" / "tiny.py"
    from jaxformer.training.config_file import load_config_file

    return load_config_file(spec_path)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory, default_models):
    directory = tmp_path_factory.mktemp("models")
    (directory / "joint.model").write_bytes(default_models["unigram"])  # 401 pieces once converted
    (directory / "german.model").write_bytes(default_id_model(GERMAN[:3000], 300, "bpe"))  # 301
    return directory


def test_validation_of_tokenizer_options(model_files):
    joint, german = str(model_files / "joint.model"), str(model_files / "german.model")
    config = tiny_config()
    config.tokenizer.separate_vocabularies = True
    with pytest.raises(ConfigError, match=r"separate_vocabularies=True .* set --config.model.share_embeddings=False"):
        experiment.validate(config)
    config.model.share_embeddings = False
    experiment.validate(config)
    assert experiment.vocabulary_sizes(config) == (1000, 1000)
    config.tokenizer.target_model_path = german
    assert experiment.vocabulary_sizes(config) == (1000, 301)  # tokenizer.vocab_size: the trained source's
    config.tokenizer.model_path = joint
    with pytest.raises(ConfigError) as raised:  # nothing is trained: 1000 contradicts the models
        experiment.validate(config)
    assert "tokenizer.vocab_size=1000" in str(raised.value) and "400 pieces, 401 with" in str(raised.value)
    config.tokenizer.vocab_size = experiment.DEFAULT_VOCAB_SIZE
    assert experiment.vocabulary_sizes(config) == (401, 301)
    model = experiment.model_config(config, 301, 401)
    assert (model.vocab_size, model.source_vocab_size, model.encoder_vocab_size) == (301, 401, 401)

    shared = tiny_config()
    shared.tokenizer.target_model_path = german
    with pytest.raises(ConfigError, match=r"target_model_path=.* needs --config.tokenizer.separate_vocabularies=True"):
        experiment.validate(shared)
    shared.tokenizer.target_model_path = None
    shared.tokenizer.model_path = joint
    with pytest.raises(
        ConfigError, match=r"tokenizer.vocab_size=1000, but tokenizer.model_path .* has 400 pieces, 401 with"
    ):
        experiment.validate(shared)
    shared.tokenizer.vocab_size = 401
    experiment.validate(shared)
    assert experiment.vocabulary_sizes(shared) == (401, 401)
    shared.tokenizer.model_path = str(model_files / "missing.model")
    with pytest.raises(TokenizerError, match="missing.model"):
        experiment.validate(shared)
    assert experiment.model_config(shared, 401).source_vocab_size is None  # shared: nothing changes


# -- the run's tokenizers, without the training loop ---------------------------------------------


def test_a_given_model_replaces_the_default_vocab_size_and_is_checked_on_resume(tmp_path, model_files, caplog):
    from jaxformer.training.run_tokenizer import tokenizer_for_run

    given = tmp_path / "given.model"
    shutil.copy(model_files / "joint.model", given)
    config = tiny_config()
    config.tokenizer.model_path = str(given)
    config.tokenizer.vocab_size = experiment.DEFAULT_VOCAB_SIZE
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    with caplog.at_level(logging.INFO):
        tokenizers = tokenizer_for_run(config, run, None, None)  # nothing to train on: nothing is trained
    assert tokenizers.shared and tokenizers.source.vocab_size == 401
    assert any(
        "has 400 pieces, 401 with jaxformer's special piece <pad> added; it replaces tokenizer.vocab_size=8000"
        in r.getMessage()
        for r in caplog.records
    )
    assert run.tokenizer_file.read_bytes() == with_jaxformer_ids(given.read_bytes())
    assert not run.target_tokenizer_file.exists()
    assert tokenizer_for_run(config, run, None, None).source.model_proto == tokenizers.source.model_proto

    given.write_bytes(
        default_id_model(ENGLISH[2000:4000] + GERMAN[2000:4000], 400, "bpe")
    )  # the file at model_path changed since
    with pytest.raises(
        CheckpointError,
        match=r"tokenizer.model_path .*given.model does not convert to .*tokenizer.model, a tokenizer no ",
    ):
        tokenizer_for_run(config, run, None, None)


# -- whole runs of train.py ---------------------------------------------------------------------


DEFAULT_STEPS = (
    "--config.training.num_train_steps=4",
    "--config.training.checkpoint_every_steps=2",
    "--config.training.eval_every_steps=4",
)


def train_command(workdir, data_dir, *overrides):
    given = {flag.split("=")[0] for flag in overrides}
    config = ROOT / "jaxformer" / "configs" / "tiny.py"
    if not config.exists():
        config = ROOT / "configs" / "tiny.py"
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(config),
        "--workdir",
        str(workdir),
        f"--config.data.data_dir={data_dir}",
        *[flag for flag in DEFAULT_STEPS if flag.split("=")[0] not in given],  # a key given twice is an error
        *overrides,
    ]


def train(workdir, data_dir, *overrides):
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags()  # one device
    env["JAX_PLATFORMS"] = "cpu"
    command = train_command(workdir, data_dir, *overrides)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


SEPARATE = ("--config.tokenizer.separate_vocabularies=True", "--config.model.share_embeddings=False")


@pytest.fixture(scope="module")
def separate_run(tmp_path_factory, data_dir, model_files):
    """Source vocabulary trained on the English side (tiny.py's 1000 pieces), target vocabulary a
    German model trained elsewhere with sentencepiece's default ids (301 pieces once converted)."""
    workdir = tmp_path_factory.mktemp("separate") / "run"
    result = train(
        workdir,
        data_dir,
        *SEPARATE,
        f"--config.tokenizer.target_model_path={model_files / 'german.model'}",
        "--config.training.bleu_every_steps=4",
        "--config.training.bleu_examples=8",
        "--config.decoding.max_extra_length=8",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir


@pytest.mark.slow  # a run with two vocabularies, then translate and evaluate
@pytest.mark.xdist_group("tokenizer-options")
def test_separate_vocabularies_train_translate_and_evaluate(separate_run, model_files, tmp_path):
    from jaxformer.commands import evaluate, translate
    from jaxformer.decoding.generate import DecodeSettings
    from jaxformer.decoding.translator import Translator
    from jaxformer.run.loading import load_checkpoint

    run = RunDirectory(separate_run)
    source, target = Tokenizer.load(run.tokenizer_file), Tokenizer.load(run.target_tokenizer_file)
    assert source.vocab_size == 1000 and target.vocab_size == 301
    assert target.model_proto == with_jaxformer_ids((model_files / "german.model").read_bytes())
    assert not any(set("äöüß") & set(piece) for piece in source.pieces(range(1000)))  # English side only

    step, metadata, params = load_checkpoint(separate_run)
    assert step == 4 and metadata.tokenizer == source.model_proto and metadata.target_tokenizer == target.model_proto
    assert metadata.load_target_tokenizer().model_proto == target.model_proto
    model = metadata.model_config()
    assert (model.source_vocab_size, model.vocab_size, model.share_embeddings) == (1000, 301, False)
    assert params["source_embedding"]["embedding"].shape == (1000, 32)
    assert params["target_embedding"]["embedding"].shape == (301, 32)
    records = [json.loads(line) for line in run.metrics_file.read_text().splitlines()]
    assert any("eval/bleu" in record for record in records)  # validation BLEU decoded with the target vocabulary

    translator = Translator.from_workdir(separate_run, settings=DecodeSettings(method="greedy", max_extra_length=8))
    assert translator.tokenizer.model_proto == source.model_proto
    assert translator.target_tokenizer.model_proto == target.model_proto
    sentences = ENGLISH[:3]
    translations = translator.translate(sentences)
    ids = translator.translate_ids([source.encode(sentence) for sentence in sentences])
    assert translations == [target.decode(hypotheses[0][0]) for hypotheses in ids]  # decoded with the target's
    assert all(int(hypotheses[0][0].max()) < target.vocab_size for hypotheses in ids)  # target ids only

    (tmp_path / "input.en").write_text("".join(f"{line}\n" for line in sentences))
    (tmp_path / "input.de").write_text("".join(f"{line}\n" for line in GERMAN[:3]))
    common = ["--workdir", str(separate_run), "--method", "greedy", "--max_extra_length", "8"]
    assert translate.main([*common, "--input", str(tmp_path / "input.en"), "--output", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out").read_text().splitlines() == translations
    scored = [*common, "--source", str(tmp_path / "input.en"), "--reference", str(tmp_path / "input.de")]
    assert evaluate.main([*scored, "--json", str(tmp_path / "scores.json")]) == 0
    assert 0.0 <= json.loads((tmp_path / "scores.json").read_text())["bleu"] <= 100.0


@pytest.mark.slow  # needs the run with two vocabularies
@pytest.mark.xdist_group("tokenizer-options")
def test_resume_refuses_another_target_tokenizer(separate_run, data_dir, model_files, tmp_path):
    workdir = shutil.copytree(separate_run, tmp_path / "copy")
    other = Tokenizer(with_jaxformer_ids(default_id_model(GERMAN[3000:6000], 300, "bpe")))
    assert other.vocab_size == 301
    other.save(RunDirectory(workdir).target_tokenizer_file)
    target_model = f"--config.tokenizer.target_model_path={model_files / 'german.model'}"
    result = train(workdir, data_dir, *SEPARATE, target_model, "--config.training.num_train_steps=6")
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: {RunDirectory(workdir).target_tokenizer_file} is not the tokenizer stored in")


@pytest.mark.slow  # to the slow set (about 10 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
@pytest.mark.xdist_group("tokenizer-options")
def test_run_with_a_model_trained_elsewhere(data_dir, tmp_path):
    given = tmp_path / "joint.model"  # sentencepiece's default ids; 1000 pieces once <pad> is added (tiny.py's size)
    given.write_bytes(default_id_model(ENGLISH[:3000] + GERMAN[:3000], 999, "bpe"))
    workdir = tmp_path / "run"
    result = train(workdir, data_dir, f"--config.tokenizer.model_path={given}")
    assert result.returncode == 0, result.stderr[-4000:]
    run = RunDirectory(workdir)
    converted = with_jaxformer_ids(given.read_bytes())
    assert run.tokenizer_file.read_bytes() == converted and not run.target_tokenizer_file.exists()
    from jaxformer.run.loading import load_checkpoint

    _, metadata, _ = load_checkpoint(workdir, params=False)
    assert metadata.tokenizer == converted and metadata.target_tokenizer is None
    assert metadata.model_config().vocab_size == 1000 and metadata.model_config().source_vocab_size is None
    original = spm.SentencePieceProcessor(model_file=str(given))
    translator_tokenizer = metadata.load_tokenizer()
    assert translator_tokenizer.pieces(translator_tokenizer.encode(GERMAN[7000], add_eos=False)) == [
        original.id_to_piece(i) for i in original.encode(GERMAN[7000])
    ]
