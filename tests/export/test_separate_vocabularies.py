"""jaxformer-export of a run with separate source and target vocabularies (two tokenizers, untied
embeddings): the target tokenizer travels as tokenizer.target.model, serve.py encodes with the
source one and decodes with the target one, and source ids are bounded by the source vocabulary."""

import hashlib
import json
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.errors import CheckpointError
from jaxformer.export import exporter
from jaxformer.export.loading import ExportError, load_export
from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import experiment
from tests.conftest import assert_same_hypotheses, read_raw
from tests.export.serving import serve_without_jaxformer

pytestmark = pytest.mark.xdist_group("export")

SETTINGS = DecodeSettings(beam_size=3, max_extra_length=8)
SERVING = exporter.ServingSettings(batch_size=4, max_source_tokens=32)
SOURCE_SIZE, TARGET_SIZE = 300, 400

SERVE = """
import json, pathlib, sys
directory, results = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
sys.path.insert(0, str(directory))
import serve

model = serve.load(directory)
nbest = model.translate_nbest(json.loads((results / "sentences.json").read_text()))
(results / "results.json").write_text(json.dumps({"nbest": nbest, "vocab_size": model.vocab_size}))
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Step 1: a random tiny model with an English source and a German target tokenizer of
    different sizes; step 2: the same with the source tokenizer stored as the target's too."""
    workdir = tmp_path_factory.mktemp("separate") / "run"
    source = train_tokenizer(read_raw("train.en.gz", 1500), vocab_size=SOURCE_SIZE)
    target = train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=TARGET_SIZE)
    model_config = preset("tiny", vocab_size=TARGET_SIZE, source_vocab_size=SOURCE_SIZE, share_embeddings=False)
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.model.share_embeddings, config.tokenizer.separate_vocabularies = False, True
    config.tokenizer.vocab_size = SOURCE_SIZE
    ones = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(Transformer(model_config).init(jax.random.key(0), ones, ones)["params"])
    metadata = CheckpointMetadata(
        config=config.to_dict(),
        model=model_config.to_dict(),
        tokenizer=source.model_proto,
        target_tokenizer=target.model_proto,
        data_fingerprint=None,
        step=1,
    )
    checkpointer = Checkpointer(RunDirectory(workdir).checkpoints, keep=None)
    checkpointer.save_params(1, params, metadata)
    checkpointer.save_params(2, params, metadata.replace(step=2, target_tokenizer=source.model_proto))
    checkpointer.close()
    return workdir


@pytest.fixture(scope="module")
def exported(workdir, tmp_path_factory):
    # In-process export: symbolic sizes are not ints (see symbolic_shapes_unchecked in conftest.py).
    disabled = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        output = tmp_path_factory.mktemp("separate-export") / "export"
        exporter.export_checkpoint(workdir, output, 1, SETTINGS, SERVING, platforms=("cpu",))
    finally:
        jaxtyping.config.update("jaxtyping_disable", disabled)
    return output


def test_the_export_holds_both_tokenizers(exported, workdir):
    _, metadata, _ = load_checkpoint(workdir, 1)
    config = json.loads((exported / "config.json").read_text())
    files = config["files"]
    assert (
        files["tokenizer"]["name"] == "tokenizer.model"
        and files["target_tokenizer"]["name"] == "tokenizer.target.model"
    )
    for role, expected in (("tokenizer", metadata.tokenizer), ("target_tokenizer", metadata.target_tokenizer)):
        data = (exported / files[role]["name"]).read_bytes()
        assert data == expected and files[role]["sha256"] == hashlib.sha256(data).hexdigest()
    assert metadata.tokenizer != metadata.target_tokenizer
    assert (config["model"]["vocab_size"], config["model"]["source_vocab_size"]) == (TARGET_SIZE, SOURCE_SIZE)
    assert config["model"]["share_embeddings"] is False


def test_serve_py_without_jaxformer_equals_the_translator(exported, workdir, tmp_path):
    translator = Translator.from_workdir(workdir, 1, settings=SETTINGS, batch_size=4, max_source_tokens=32)
    lengths = {text: len(translator.tokenizer.encode(text)) for text in read_raw("val.en.gz", 100)}
    sentences = [text for text, length in lengths.items() if 17 <= length <= 32][:3] + [""]
    assert len(sentences) == 4
    (tmp_path / "sentences.json").write_text(json.dumps(sentences))
    serving = serve_without_jaxformer(SERVE, exported, tmp_path)
    try:  # the references while it runs
        expected = translator.translate_nbest(sentences)
        served = load_export(exported)
        in_process = served.translate_nbest(sentences)
        _, stderr = serving.communicate(timeout=300)
    finally:
        serving.kill()
    assert serving.returncode == 0, stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert_same_hypotheses(result["nbest"], expected)
    assert in_process == [[tuple(hypothesis) for hypothesis in hypotheses] for hypotheses in result["nbest"]]
    assert result["vocab_size"] == SOURCE_SIZE
    assert all(hypotheses[0][0] for hypotheses in expected[:3]) and expected[3] == [("", 0.0)]  # texts to compare
    pieces = [translator.tokenizer.encode(text) for text in sentences[:3]]  # the source tokenizer's ids
    tokens = [hypotheses[0][0] for hypotheses in translator.translate_ids(pieces)]
    assert [served.target_tokenizer.decode(ids) for ids in tokens] == [hypotheses[0][0] for hypotheses in expected[:3]]

    source = np.full((1, 16), 5, np.int32)
    source[0, -1] = 1  # EOS, ending the one sentence
    source[0, 0] = SOURCE_SIZE  # a target id, beyond the source vocabulary
    with pytest.raises(
        ValueError,
        match=rf"^source row 0: id {SOURCE_SIZE} at position 0 is outside the model's source vocabulary "
        rf"\[0, {SOURCE_SIZE}\)$",
    ):
        served.translate_ids(source)
    rows = np.concatenate([np.array([[5] * 15 + [1]], np.int32), source])  # the row and position named
    with pytest.raises(ValueError, match=rf"^source row 1: id {SOURCE_SIZE} at position 0 is outside"):
        served.translate_ids(rows)


def test_tokenizers_that_do_not_fit_the_model_are_refused(workdir, exported, tmp_path):
    with pytest.raises(
        CheckpointError, match=f"target vocabulary has {TARGET_SIZE} tokens, its tokenizer {SOURCE_SIZE}"
    ):
        exporter.export_checkpoint(workdir, tmp_path / "refused", 2, SETTINGS, SERVING, platforms=("cpu",))
    assert not (tmp_path / "refused").exists()

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    config = json.loads((copy / "config.json").read_text())
    source_model = (copy / "tokenizer.model").read_bytes()
    (copy / "tokenizer.target.model").write_bytes(source_model)  # verified, but of the source's size
    config["files"]["target_tokenizer"]["sha256"] = hashlib.sha256(source_model).hexdigest()
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ExportError,
        match=f"tokenizer.target.model has {SOURCE_SIZE} pieces, but .*config.json gives the model "
        f"model.vocab_size={TARGET_SIZE}$",
    ):
        load_export(copy)
    config["files"].pop("target_tokenizer")  # the target ids would be decoded with the source's tokenizer
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ExportError,
        match=f"config.json: model.source_vocab_size is {SOURCE_SIZE} \\(separate vocabularies\\), but files lacks "
        "a target_tokenizer$",
    ):
        load_export(copy)
