"""A damaged export named in one line: a missing, damaged or edited file (its checksum, or what
its reader finds behind a matching one), a helper of serve.py missing or edited beside it, and a
folder that holds no export at all."""

import hashlib
import json
import shutil

import pytest

from jaxformer.decoding.translator import Translator
from jaxformer.errors import UserError
from jaxformer.export import standalone
from jaxformer.export.loading import ExportError, load_export
from tests.export.serving import run_serve_py

pytestmark = pytest.mark.xdist_group("export")


@pytest.mark.parametrize(
    "damage, file_name, message",
    [
        (lambda d: (d / "params.safetensors").unlink(), "params.safetensors", "no such file"),
        (lambda d: _flip_byte(d / "beam_search.jaxexport"), "beam_search.jaxexport", "damaged"),
        (lambda d: _flip_byte(d / "params.safetensors"), "params.safetensors", "damaged"),
        (lambda d: _flip_byte(d / "tokenizer.model"), "tokenizer.model", "damaged"),
        (lambda d: (d / "config.json").write_text('{"format": "jaxformer-export", '), "config.json", "not valid JSON"),
        (lambda d: (d / "config.json").unlink(), "config.json", "no such file"),
        (lambda d: (d / "sentence_batches.py").unlink(), "sentence_batches.py", "no such file"),
        (lambda d: _append(d / "sentence_batches.py", b"\nprint('edited')\n"), "sentence_batches.py", "edited"),
        (lambda d: _append(d / "serve.py", b"\n# edited\n"), "serve.py", "edited"),
    ],
)
def test_a_missing_or_damaged_file_is_named_in_one_line(exported, tmp_path, damage, file_name, message):
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    damage(copy)
    for load, error_type in (
        (standalone.load, standalone.ExportError),
        (load_export, ExportError),
        (Translator.from_export, UserError),
    ):
        with pytest.raises(error_type, match=message) as error:
            load(copy)
        assert str(copy / file_name) in str(error.value) and "\n" not in str(error.value)


def test_damage_behind_matching_checksums_is_still_named(exported, tmp_path):
    """A file replaced together with its checksum: the readers themselves name it."""
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    config = json.loads((copy / "config.json").read_text())
    for role, garbage, message in (
        ("program", b"\x10\0\0\0not a flatbuffer at all", "cannot deserialize"),
        ("tokenizer", b"not a sentencepiece model", "sentencepiece cannot parse"),
        ("parameters", b"\x02\0\0\0\0\0\0\0{}", "does not hold the parameters"),
    ):
        original = (copy / config["files"][role]["name"]).read_bytes()
        _replace_file(copy, config, role, garbage)
        with pytest.raises(ExportError, match=message):
            load_export(copy)
        _replace_file(copy, config, role, original)
    load_export(copy)  # restored: reads again


def _append(path, data):
    path.write_bytes(path.read_bytes() + data)


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _replace_file(directory, config, role, data):

    (directory / config["files"][role]["name"]).write_bytes(data)
    config["files"][role]["sha256"] = hashlib.sha256(data).hexdigest()
    (directory / "config.json").write_text(json.dumps(config))


def test_serve_py_names_a_missing_helper(exported, tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(exported / "serve.py", lone / "serve.py")  # without sentence_batches.py beside it
    result = run_serve_py(lone, input="", timeout=120)
    assert result.returncode != 0
    assert f"{lone / 'sentence_batches.py'} is missing" in result.stderr


def test_a_folder_without_an_export_is_said_to_be_no_export(exported, tmp_path):
    """No config.json and no serve.py: not an export at all, not an incomplete one (which an
    export that lost its config.json is: see test_a_missing_or_damaged_file_is_named_in_one_line)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not an export\n")
    for load, error_type in ((standalone.load, standalone.ExportError), (load_export, ExportError)):
        with pytest.raises(error_type) as error:
            load(other)
        assert str(error.value) == f"{other} is not a jaxformer export (no config.json in it)"
        with pytest.raises(error_type) as error:  # a file of the export, for its folder
            load(exported / "config.json")
        assert str(error.value) == (
            f"{exported / 'config.json'} is a file, not an export's folder: give the folder that holds config.json"
        )
    result = run_serve_py(exported, other, input="A man.\n", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: {other} is not a jaxformer export (no config.json in it)\n"


def test_serve_py_checks_a_helper_before_running_it(exported, tmp_path):
    """An edited copy of a helper is refused before any of its code runs; an older export's (no
    digest recorded) that cannot run is named in one line, not a traceback."""
    edited = tmp_path / "edited"
    shutil.copytree(exported, edited)
    marker = tmp_path / "ran"
    _append(edited / "sentence_batches.py", f"\nopen({str(marker)!r}, 'w').close()\n".encode())
    result = run_serve_py(edited, input="A man.\n", timeout=120)
    assert result.returncode == 2 and result.stdout == "" and not marker.exists()
    assert result.stderr == (
        f"error: {edited / 'sentence_batches.py'} is damaged or edited: its SHA-256 differs from the one in "
        f"{edited / 'config.json'}\n"
    )

    older = tmp_path / "older"
    shutil.copytree(exported, older)
    config = json.loads((older / "config.json").read_text())
    config["files"]["loader"]["imports"] = [entry["name"] for entry in config["files"]["loader"]["imports"]]
    (older / "config.json").write_text(json.dumps(config))
    truncated = (older / "sentence_batches.py").read_bytes()
    (older / "sentence_batches.py").write_bytes(truncated[: truncated.index(b"def ") + 12])
    result = run_serve_py(older, input="A man.\n", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {older / 'sentence_batches.py'} cannot be imported (SyntaxError: ")
    assert result.stderr.count("\n") == 1
