"""A translator composed from the language models, its encoder from the masked LM's and its
decoder from the causal LM's: the starting parameters, the checks against its config, a run
trained end to end, and the shipped configs' fit."""

import logging
import pathlib
import re

import jax
import ml_collections
import numpy as np
import pytest
from flax import traverse_util

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.model.architectures import build_model
from jaxformer.model.config import ConfigError
from jaxformer.model.transformer import Transformer
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training.config_file import load_config
from jaxformer.training.experiment import model_config
from jaxformer.training.init_from import StartingPoint, load_starting_points, starting_overrides
from jaxformer.training.state import init_params
from tests.training.test_language_models import NAMES, TINY
from tests.training.test_loop import losses, train

README = pathlib.Path(__file__).parents[2] / "README.md"

pytestmark = pytest.mark.xdist_group("language-models")  # the language models' runs are trained once


@pytest.fixture(scope="module")
def runs(trained_language_models):
    return trained_language_models[0]


def test_a_translator_starts_from_both(runs):
    pretrained = runs
    training = ml_collections.ConfigDict(
        {
            "init_from": None,
            "init_encoder_from": str(pretrained["multi30k_mlm"]),
            "init_decoder_from": str(pretrained["multi30k_lm"]),
            "init_checkpoint": "latest",
        }
    )
    points = load_starting_points(training)
    _, mlm_metadata, mlm_params = load_checkpoint(pretrained["multi30k_mlm"])
    _, lm_metadata, lm_params = load_checkpoint(pretrained["multi30k_lm"])
    config = lm_metadata.model_config().replace(
        architecture="encoder_decoder", share_embeddings=False, source_vocab_size=600
    )
    abstract = jax.eval_shape(lambda: init_params(Transformer(config), jax.random.key(0), 8, 8))
    overrides = starting_overrides(points, abstract, config)
    mlm, lm = traverse_util.flatten_dict(mlm_params, sep="/"), traverse_util.flatten_dict(lm_params, sep="/")
    expected = {name.replace("embedding/", "source_embedding/", 1): value for name, value in mlm.items()}
    expected.update({name.replace("embedding/", "target_embedding/", 1): value for name, value in lm.items()})
    expected = {name: value for name, value in expected.items() if not name.startswith("mlm_head/")}
    assert sorted(overrides) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(overrides[name], value, err_msg=name)
    fresh = set(traverse_util.flatten_dict(abstract, sep="/")) - set(overrides)
    assert fresh and all("/cross_attention" in name for name in fresh)  # only the cross-attention is new

    with pytest.raises(ConfigError, match="each give an embedding"):
        starting_overrides(points, abstract, config.replace(share_embeddings=True, source_vocab_size=None))
    swapped = ml_collections.ConfigDict({**training.to_dict(), "init_encoder_from": str(pretrained["multi30k_lm"])})
    with pytest.raises(
        ConfigError, match="holds a decoder_only model; a translator's encoder starts from an encoder_only run$"
    ):
        load_starting_points(swapped)
    swapped = ml_collections.ConfigDict({**training.to_dict(), "init_decoder_from": str(pretrained["multi30k_mlm"])})
    with pytest.raises(
        ConfigError, match="holds an encoder_only model; a translator's decoder starts from a decoder_only run$"
    ):
        load_starting_points(swapped)


def test_a_translators_start_from_a_language_model_is_checked_against_its_config(runs):
    from jaxformer.training.config_file import apply_overrides
    from jaxformer.training.init_from import check_starting_points

    config = load_config("multi30k")
    apply_overrides(config, [flag[len("--config.") :].split("=", 1) for flag in TINY])
    config.training.init_encoder_from = str(runs["multi30k_mlm"])
    config.training.init_decoder_from = str(runs["multi30k_lm"])
    check_starting_points(load_starting_points(config.training), config)  # the README's composition fits

    deeper = config.copy_and_resolve_references()  # both parts differ: one error names both
    deeper.model.num_encoder_layers += 1
    deeper.model.num_decoder_layers += 1
    layers = (config.model.num_encoder_layers, config.model.num_decoder_layers)
    with pytest.raises(ConfigError) as refused:
        check_starting_points(load_starting_points(deeper.training), deeper)
    assert re.fullmatch(
        rf"training.init_encoder_from: step \d+ of \S+ was trained with another model section; set it as in that "
        rf"run: model.num_encoder_layers={layers[0]} there, {layers[0] + 1} here; and training.init_decoder_from: "
        rf"step \d+ of \S+ was trained with another model section; set it as in that run: "
        rf"model.num_decoder_layers={layers[1]} there, {layers[1] + 1} here",
        str(refused.value),
    )

    config.training.init_encoder_from = None  # one part under one shared vocabulary
    config.tokenizer.separate_vocabularies, config.model.share_embeddings = False, True
    with pytest.raises(ConfigError, match="training.init_decoder_from alone with one shared vocabulary"):
        check_starting_points(load_starting_points(config.training), config)

    config.training.init_decoder_from, config.training.init_from = None, str(runs["multi30k_lm"])
    with pytest.raises(
        ConfigError,
        match=r"holds a decoder_only model and this run has model.architecture='encoder_decoder'; to start a "
        r"translator's decoder from it, use training.init_decoder_from$",
    ):
        check_starting_points(load_starting_points(config.training), config)


@pytest.mark.slow  # a third run; the composed starting point is checked in test_a_translator_starts_from_both
def test_composed_translator_trains_end_to_end(runs, data_dir, tmp_path):
    pretrained = runs
    workdir = tmp_path / "composed"
    train(
        workdir,
        data_dir,
        *TINY[:-4],
        f"--config.training.init_encoder_from={pretrained['multi30k_mlm']}",
        f"--config.training.init_decoder_from={pretrained['multi30k_lm']}",
        "--config.tokenizer.separate_vocabularies=True",
        "--config.model.share_embeddings=False",
        "--config.training.num_train_steps=10",
        "--config.training.eval_every_steps=10",
        "--config.training.checkpoint_every_steps=10",
    )
    assert set(losses(workdir, "eval/loss")) == {0, 10}  # the starting model is evaluated first
    _, metadata, _ = load_checkpoint(workdir)
    _, mlm_metadata, _ = load_checkpoint(pretrained["multi30k_mlm"])
    _, lm_metadata, _ = load_checkpoint(pretrained["multi30k_lm"])
    assert metadata.tokenizer == mlm_metadata.tokenizer and metadata.target_tokenizer == lm_metadata.tokenizer
    assert Tokenizer(metadata.tokenizer).mask_id is not None


@pytest.mark.parametrize("parts", [("encoder", "decoder"), ("decoder",)])
def test_a_mesh_that_does_not_divide_a_composed_translator_is_refused_before_the_data(parts, runs, tmp_path, no_data):
    """Its vocabularies come from its starts' runs (a side without one: from its config): the mesh
    was checked against the model only once its data was prepared and its tokenizers made."""
    from jaxformer.training import run_start
    from jaxformer.training.config_file import apply_overrides
    from jaxformer.training.sharding import MeshError

    config = load_config("multi30k")
    apply_overrides(config, [flag[len("--config.") :].split("=", 1) for flag in TINY])
    starts = {"encoder": ("init_encoder_from", "multi30k_mlm"), "decoder": ("init_decoder_from", "multi30k_lm")}
    for part in parts:
        key, name = starts[part]
        config.training[key] = str(runs[name])
    # The sizes checked are those of the tokenizers the run takes: each start's, or one trained here.
    pieces = {part: Tokenizer(load_checkpoint(runs[starts[part][1]], params=False)[1].tokenizer) for part in parts}
    sizes = [pieces[part].vocab_size if part in pieces else config.tokenizer.vocab_size for part in starts]
    assert run_start.vocabulary_sizes_before_the_data(config, None, load_starting_points(config.training)) == tuple(
        sizes
    )
    config.mesh.shape = (1, 1, 8)
    with pytest.raises(MeshError, match=r"^mesh.shape=\(1, 1, 8\): model.num_heads=4 is not divisible by its mesh"):
        run_start.prepare_run(config, tmp_path / "composed")


def _shipped_starting_points():
    """The shipped multi30k translator's model config, its abstract parameters, and zero-valued
    starting points of the shipped masked LM (encoder) and causal LM (decoder) at their sizes."""
    configs = {name: load_config(name) for name in NAMES}
    translator_config = load_config("multi30k")
    vocab = translator_config.tokenizer.vocab_size
    assert translator_config.tokenizer.separate_vocabularies  # each side's embedding comes from its own run
    assert all(config.tokenizer.vocab_size == vocab for config in configs.values())
    translator = model_config(translator_config, vocab, vocab)
    abstract = jax.eval_shape(lambda: init_params(build_model(translator), jax.random.key(0), 8, 8))
    parts = {"multi30k_mlm": "encoder", "multi30k_lm": "decoder"}
    points = []
    for name, config in configs.items():
        pretrained = model_config(config, vocab)
        shapes = jax.eval_shape(lambda p=pretrained: init_params(build_model(p), jax.random.key(0), 8, 8))
        params = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes)
        metadata = CheckpointMetadata(
            config=config.to_dict(), model=pretrained.to_dict(), tokenizer=b"", data_fingerprint=None, step=0
        )
        points.append(StartingPoint(where=name, step=0, metadata=metadata, params=params, part=parts[name]))
    return translator, abstract, points


def test_the_shipped_language_models_fit_the_shipped_translator():
    """The README's composed translator (`--config multi30k` with init_encoder_from=multi30k_mlm,
    init_decoder_from=multi30k_lm) at the shipped sizes: every pretrained parameter fits, and only
    the cross-attention starts fresh. The tests above shrink all three configs alike, so only this
    one sees the shipped widths."""
    translator, abstract, points = _shipped_starting_points()
    overrides = starting_overrides(points, abstract, translator)  # ConfigError listing the misfits otherwise
    fresh = set(traverse_util.flatten_dict(abstract, sep="/")) - set(overrides)
    assert fresh and all("/cross_attention" in name for name in fresh)


def test_the_masked_lms_head_left_out_is_said(caplog):
    """The masked LM's head (mlm_head/...), which a translator has no place for, is named in the
    log as left out, as the parameters that start from random values are: nothing of a starting
    checkpoint is dropped unsaid. The causal LM gives every array it has."""
    translator, abstract, points = _shipped_starting_points()
    with caplog.at_level(logging.INFO, logger="jaxformer.training.init_from"):
        starting_overrides(points, abstract, translator)
    left_out = [record.getMessage() for record in caplog.records if "left out" in record.getMessage()]
    assert left_out == [
        "4 of 53 parameter arrays of multi30k_mlm have no place in a translator's encoder and are left out: "
        "mlm_head/dense/bias, mlm_head/dense/kernel, mlm_head/norm/bias, mlm_head/norm/scale"
    ]


def test_the_measured_composed_runs_flags_are_accepted_by_the_shipped_config():
    """README's measurement of the composed translator names the flags its 400-step runs took on
    top of `--config multi30k`; the shipped config with them passes the config checks, so the
    runs can be repeated as README tells (num_train_steps=400 alone ended within the budget
    schedule's 800-step warmup: refused)."""
    from jaxformer.training.config_file import apply_overrides
    from jaxformer.training.config_rules import check_combinations

    section = README.read_text().split("### A translator from a pretrained encoder and decoder")[1]
    measured = " ".join(section.split("Measured here at the shipped sizes")[1].split("each scored once")[0].split())
    spans = " ".join(re.findall(r"`([^`]*)`", measured))
    flags = re.findall(r"--config\.([\w.]+)=(\S+)", spans)
    names = [key for key, _ in flags]
    assert "training.num_train_steps" in names and "training.final_choice" in names
    config = load_config("multi30k")
    apply_overrides(config, flags)
    check_combinations(config, "encoder_decoder")  # ConfigError where README's flags are refused
