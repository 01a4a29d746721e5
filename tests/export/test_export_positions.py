"""An export of a model with a last position (model.max_positions: an imported MarianMT model's)
takes --max_source_tokens as translate does: none given, 256 or the positions where fewer; more
than the positions refused before the parameters are read (it was capped without a word)."""

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from jaxformer.decoding.generate import DecodeSettings  # noqa: E402
from jaxformer.export import exporter  # noqa: E402
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


def test_none_given_takes_the_models_positions_where_fewer_than_256(run, tmp_path, symbolic_shapes_unchecked):
    summary = exporter.export_checkpoint(run, tmp_path / "out", settings=SETTINGS, platforms=("cpu",))
    serving = json.loads((summary.directory / "config.json").read_text())["serving"]
    assert (serving["max_source_tokens"], serving["max_source_length"]) == (POSITIONS, 16)
