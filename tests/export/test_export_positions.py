"""An export of a model with a last position (model.max_positions: an imported MarianMT model's)
takes --max_source_tokens as translate does: none given, 256 or the positions where fewer; more
than the positions refused before the parameters are read (it was capped without a word)."""

import json
import shutil

import jaxtyping
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from jaxformer.decoding.generate import DecodeSettings  # noqa: E402
from jaxformer.export import exporter, standalone  # noqa: E402
from jaxformer.export.loading import ExportError  # noqa: E402
from jaxformer.interop.marian import import_marian  # noqa: E402
from tests.interop.marian_models import write_marian  # noqa: E402

POSITIONS = 12
SETTINGS = DecodeSettings(method="greedy", max_extra_length=8)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("positions")
    write_marian(folder / "hf", max_position_embeddings=POSITIONS)
    import_marian(folder / "hf", folder / "run")
    return folder / "run"


def test_more_source_tokens_than_the_models_positions_are_refused_before_its_parameters(run, tmp_path, monkeypatch):
    def unread(*args, **kwargs):
        raise AssertionError("the parameters were read")

    original = exporter.load_checkpoint
    monkeypatch.setattr(
        exporter,
        "load_checkpoint",
        lambda *args, before_params, **kwargs: original(
            *args, before_params=lambda metadata: (before_params(metadata), unread()), **kwargs
        ),
    )
    with pytest.raises(ExportError, match=rf"^max_source_tokens=13 is more than the model's {POSITIONS} positions"):
        exporter.export_checkpoint(
            run, tmp_path / "wide", settings=SETTINGS, serving=exporter.ServingSettings(max_source_tokens=13)
        )
    assert not (tmp_path / "wide").exists()


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    """An export with no --max_source_tokens (rows of 16 tokens: the 12 positions rounded up)."""
    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)  # symbolic_shapes_unchecked's, for a module's fixture
    try:
        output = tmp_path_factory.mktemp("export") / "out"
        return exporter.export_checkpoint(run, output, settings=SETTINGS, platforms=("cpu",)).directory
    finally:
        jaxtyping.config.update("jaxtyping_disable", previous)


def test_none_given_takes_the_models_positions_where_fewer_than_256(exported):
    serving = json.loads((exported / "config.json").read_text())["serving"]
    assert (serving["max_source_tokens"], serving["max_source_length"]) == (POSITIONS, 16)


def test_a_max_source_tokens_edited_past_the_models_positions_is_refused_by_the_loader(exported, tmp_path):
    """config.json's serving.max_source_tokens raised past the positions, within the rows the program
    takes (13 here, rows of 16), was loaded: serve.py then gave a long line's pieces of more ids than
    the positions to the search and failed in a traceback, exit 1 (measured: 48 on 40 positions,
    'ValueError: source 0 has 43 ids (EOS included), more than the model's 40 positions ...')."""
    edited = tmp_path / "edited"
    shutil.copytree(exported, edited)
    config = json.loads((edited / "config.json").read_text())
    config["serving"]["max_source_tokens"] = POSITIONS + 1
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(standalone.ExportError) as refusal:
        standalone.load(edited)
    assert str(refusal.value) == (
        f"{edited / 'config.json'}: serving.max_source_tokens 13 is more than the model's {POSITIONS} positions "
        f"(model.max_positions); it must be at most {POSITIONS}"
    )
    config["serving"]["max_source_tokens"] = POSITIONS - 4  # a smaller one is the edit README allows
    (edited / "config.json").write_text(json.dumps(config))
    assert standalone.load(edited).max_source_tokens == POSITIONS - 4
