"""config.json's "model" is the model the export's program was traced with: its dtypes, dropout,
activation, normalization, positions, attention implementation and sizes are in the program, and
serve.py builds nothing from them, so a hand edit changed nothing, silently (the parameters are
held to the program, not to config.json's sizes). The program's function name records the model
(jaxformer/export/program.py's function_name) and the loader refuses an edit that disagrees."""

import json
import shutil

import jax
import pytest

from jaxformer.export import export_program
from jaxformer.export.loading import ExportError, load_export
from tests.export.exports import record_in_program
from tests.export.serving import run_serve_py

pytestmark = pytest.mark.xdist_group("export")  # the export fixture of conftest.py, made once

REMEDY = "fixed when it was exported from the checkpoint; export again (from a run of the model you want) to change it"


def _copy(exported, tmp_path, edit=lambda model: None):
    """A copy of the export whose config.json's "model" `edit(model)` changed."""
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config["model"])
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def _program(directory):
    config = json.loads((directory / "config.json").read_text())
    path = directory / config["files"]["program"]["name"]
    return config, path, jax.export.deserialize(bytearray(path.read_bytes()))


def test_the_program_records_config_jsons_model(exported):
    config, path, program = _program(exported)
    search, recorded = export_program.program_function(program, path)
    assert search == "beam_search" and recorded["model"] == config["model"]
    assert config["model"]["deterministic"] is True and config["model"]["dtype"] == "float32"  # the decoding variant


# The test export's model: jaxformer's tiny preset (d_model 32), float32, relu, post-norm, dropout 0.1
# (off: deterministic), interleaved positions of base 10000 and no last one, jaxformer's attention.
@pytest.mark.parametrize(
    "key, value, recorded",
    [
        ("dtype", "bfloat16", '"float32"'),
        ("matmul_dtype", "bfloat16", "null"),
        ("param_dtype", "float16", '"float32"'),
        ("dropout_rate", 0.3, "0.1"),
        ("deterministic", False, "true"),
        ("attention_implementation", "xla", '"jaxformer"'),
        ("position_layout", "halves", '"interleaved"'),
        ("position_base", 500.0, "10000.0"),
        ("max_positions", 40, "null"),
        ("normalization", "pre", '"post"'),
        ("activation", "gelu", '"relu"'),
        ("layer_norm_epsilon", 1e-5, "1e-06"),
        ("d_model", 64, "32"),
        ("share_embeddings", 1, "true"),  # 1 == True, but not the record's boolean
        ("architecture", None, '"encoder_decoder"'),  # removed
    ],
)
def test_an_edit_of_the_model_the_program_fixes_is_refused(exported, tmp_path, key, value, recorded):
    """Each loaded (the parameters match the program, whatever config.json says), and translated
    with the exported model."""
    copy = _copy(exported, tmp_path, lambda model: model.pop(key) if value is None else model.update({key: value}))
    program = copy / "beam_search.jaxexport"
    with pytest.raises(ExportError) as error:
        load_export(copy)
    shown = "absent" if value is None else json.dumps(value)
    assert str(error.value) == (
        f"{copy / 'config.json'}: model.{key} is {shown}, but {program} runs the model with {key} {recorded}, {REMEDY}"
    )


def test_an_edited_model_is_refused_before_the_parameters_are_read(exported, tmp_path):
    copy = _copy(exported, tmp_path, lambda model: model.update(dtype="bfloat16"))
    (copy / "params.safetensors").unlink()
    with pytest.raises(ExportError, match=r"config\.json: model\.dtype is \"bfloat16\", but "):
        load_export(copy)


def test_serve_py_refuses_an_edited_model_in_one_line(exported, tmp_path):
    """The export's own copy of export_program.py, beside serve.py, checks it."""
    copy = _copy(exported, tmp_path, lambda model: model.update(dtype="bfloat16"))
    served = run_serve_py(copy, input="A man rides a horse.\n")
    assert (served.returncode, served.stdout) == (2, "")
    assert served.stderr == (
        f'error: {copy / "config.json"}: model.dtype is "bfloat16", but {copy / "beam_search.jaxexport"} runs the '
        f'model with dtype "float32", {REMEDY}\n'
    )


@pytest.mark.parametrize("record", ["settings alone", "search alone"])
def test_an_older_exports_model_loads_unchecked(exported, tmp_path, record):
    """A program exported before its name recorded the model (its decoding settings alone, as
    ea81308's; or the search's name alone, as before) loads with an edited model, as it did."""
    copy = _copy(exported, tmp_path, lambda model: model.update(dtype="bfloat16", attention_implementation="xla"))
    assert '"model": {' in _program(copy)[2].fun_name  # a new export's record, which older ones lack
    settings_alone = record == "settings alone"
    record_in_program(
        copy, lambda r: {key: value for key, value in r.items() if key != "model"} if settings_alone else None
    )
    assert load_export(copy).config["model"]["dtype"] == "bfloat16"
    if settings_alone:  # its decoding settings are still held to the record
        config = json.loads((copy / "config.json").read_text())
        config["decoding"]["alpha"] = 1.0
        (copy / "config.json").write_text(json.dumps(config))
        with pytest.raises(ExportError, match=r"decoding\.alpha is 1\.0, but .* searches with alpha 0\.6, fixed"):
            load_export(copy)


def test_the_recorded_model_must_be_an_object(exported, tmp_path):
    copy = _copy(exported, tmp_path)
    record_in_program(copy, lambda r: r | {"model": "float32"})
    with pytest.raises(ExportError) as error:
        load_export(copy)
    assert str(error.value) == (
        f"{copy / 'beam_search.jaxexport'}: its function's name records the model as 'float32', not a JSON object"
    )
