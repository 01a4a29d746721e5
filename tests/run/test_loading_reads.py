"""A language model's run asked for the best/ or final/ it never keeps: the loader reads its latest
checkpoint's metadata once, both to let the caller refuse that model (`before_params`) and to say
why the checkpoint is missing. It read it twice: once for the refusal, once more for the message."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.errors import CheckpointError
from jaxformer.model.architectures import build_model
from jaxformer.model.config import preset
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_checkpoint, locate_checkpoint
from jaxformer.training import experiment
from tests.conftest import read_raw, save_checkpoints

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("loading-reads")


@pytest.fixture(scope="module")
def lm_workdir(tmp_path_factory):
    """A causal LM's workdir with one checkpoint (step 1) of zero parameters, found without compiling."""
    tokenizer = train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=300)
    model_config = preset("tiny", architecture="decoder_only", vocab_size=tokenizer.vocab_size)
    shapes = nn.meta.unbox(jax.eval_shape(build_model(model_config).init, jax.random.key(0), jnp.ones((1, 4), int)))
    params = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes["params"])
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.model.architecture = "decoder_only"
    workdir = tmp_path_factory.mktemp("lm")
    save_checkpoints(workdir, config, model_config, tokenizer, {1: params})
    return workdir


@pytest.fixture
def reads(monkeypatch):
    """The steps whose metadata Checkpointer.read_metadata reads, in order."""
    steps = []
    read_metadata = Checkpointer.read_metadata

    def counted(self, step):
        steps.append(step)
        return read_metadata(self, step)

    monkeypatch.setattr(Checkpointer, "read_metadata", counted)
    return steps


@pytest.mark.parametrize("which", ["best", "final"])
def test_a_missing_checkpoint_of_a_language_models_run_reads_its_metadata_once(lm_workdir, reads, which):
    checked = []
    with pytest.raises(CheckpointError) as missing:
        load_checkpoint(lm_workdir, which, params=False, before_params=lambda metadata: checked.append(metadata.step))
    assert str(missing.value) == (
        f"{lm_workdir / which} does not exist: no {which!r} checkpoint in {lm_workdir}: "
        f"{which}/ holds the {'best checkpoint' if which == 'best' else 'final choice, made'} by validation BLEU, "
        "which a language model's run, translating nothing, never has; choose latest, averaged or a step number"
    )
    assert checked == [1]  # the caller saw the model before the checkpoint was said missing
    assert reads == [1]  # was [1, 1]: the refusal's read, then the message's


def test_a_refusal_of_the_model_reads_it_once_and_says_only_that(lm_workdir, reads):
    def refuse(metadata):
        raise ValueError(f"refused: {metadata.model['architecture']}")

    with pytest.raises(ValueError, match="^refused: decoder_only$"):
        load_checkpoint(lm_workdir, "best", params=False, before_params=refuse)
    assert reads == [1]


def test_locating_a_missing_checkpoint_reads_the_metadata_once_and_another_kind_none(lm_workdir, reads):
    with pytest.raises(CheckpointError, match="which a language model's run, translating nothing, never has"):
        locate_checkpoint(lm_workdir, "final")
    assert reads == [1]
    with pytest.raises(CheckpointError, match="jaxformer-average-checkpoints"):
        locate_checkpoint(lm_workdir, "averaged")
    assert reads == [1]  # "averaged" is made by a command, whatever the model: nothing to read
