"""config.json's keys: one the loader does not read and no export writes (an added "beam_size", a
misspelled "max_source_tokenz") is refused in one line naming config.json, the key and its near
matches or the keys its section takes, before anything else of the export is read; the loader's
lists of keys (export_files.CONFIG_KEYS and DECODING_KEYS, which an export cannot import from
jaxformer) are the model's and the searches' own."""

import dataclasses
import json

import pytest

from jaxformer.decoding.generate import DecodeSettings
from jaxformer.export import export_files, exporter, standalone
from jaxformer.export.loading import ExportError, load_export
from jaxformer.model.config import TransformerConfig

pytestmark = pytest.mark.xdist_group("export")  # the export fixture of conftest.py, made once

SAMPLING = {"method": "sample", "max_extra_length": 8, "temperature": 1.0, "top_k": 0, "seed": 0}


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: c.update(beam_size=8),
            "unknown key 'beam_size', which this loader does not read; config.json takes format, format_version, "
            "model, decoding, special_tokens, serving, checkpoint, platforms, platforms_failed, program, files",
        ),
        (
            lambda c: c["serving"].update(max_source_tokenz=64),
            "unknown key 'serving.max_source_tokenz', which this loader does not read; did you mean "
            "serving.max_source_tokens, serving.max_source_length?",
        ),
        (
            lambda c: c["decoding"].update(beam_sizes=8),
            "unknown key 'decoding.beam_sizes', which this loader does not read; did you mean decoding.beam_size?",
        ),
        (
            lambda c: c["model"].update(max_position=512),
            "unknown key 'model.max_position', which this loader does not read; did you mean model.max_positions",
        ),
        (  # a key of a beam search's decoding, which a sampling export's program does not take
            lambda c: c.update(format_version=2, decoding=SAMPLING | {"beam_size": 8}),
            "unknown key 'decoding.beam_size', which this loader does not read; a sample export's decoding "
            "takes method, max_extra_length, renormalize_after_bans, temperature, top_k, seed",
        ),
    ],
)
def test_a_key_the_loader_does_not_read_is_refused_naming_it(exported, tmp_path, edit, message):
    config = json.loads((exported / "config.json").read_text())
    edit(config)
    # The export's edited config.json alone: the keys are refused before any other file is looked for.
    (tmp_path / "config.json").write_text(json.dumps(config))
    for load, error_type in ((standalone.load, standalone.ExportError), (load_export, ExportError)):
        with pytest.raises(error_type) as error:
            load(tmp_path)
        assert str(error.value).startswith(f"{tmp_path / 'config.json'}: {message}"), str(error.value)
        assert "\n" not in str(error.value)


def test_the_keys_an_export_writes_are_the_loaders(exported):
    """A field jaxformer adds to TransformerConfig or DecodeSettings is written into every export:
    export_files.py's twins must hold it, or no export would load."""
    assert set(export_files.CONFIG_KEYS["model"]) == {field.name for field in dataclasses.fields(TransformerConfig)}
    assert set(export_files.DECODING_KEYS["beam"]) == {field.name for field in dataclasses.fields(DecodeSettings)}
    for method in ("greedy", "sample"):
        record = exporter.decoding_record(DecodeSettings(method=method), seed=0)
        assert set(export_files.DECODING_KEYS[method]) == set(record), method
    serving = {field.name for field in dataclasses.fields(exporter.ServingSettings)} | {"max_source_length"}
    assert set(export_files.CONFIG_KEYS["serving"]) == serving
    config = json.loads((exported / "config.json").read_text())
    assert set(config) == set(export_files.CONFIG_KEYS[""])
    for section in ("special_tokens", "checkpoint", "program", "files"):
        assert set(config[section]) <= set(export_files.CONFIG_KEYS[section]), section
