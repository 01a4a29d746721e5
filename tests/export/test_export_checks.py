"""What the export's loader and command check before they work: every value of config.json the
loader uses (its type, range and agreement with the program), an --overwrite output that holds
more than an export, and repeated platforms. A signal during an export:
test_export_interruptions.py."""

import json
import os
import re
import shutil

import pytest

from jaxformer.commands import export
from jaxformer.decoding.translator import Translator
from jaxformer.export import export_program, exporter, output_folder, standalone
from jaxformer.export.loading import ExportError, load_export
from tests.export.exports import FLAGS
from tests.export.serving import run_serve_py

pytestmark = pytest.mark.xdist_group("export")  # the export fixture of conftest.py, made once


def _edit_config(directory, edit):
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def _set(section, key, value):
    return lambda config: config[section].__setitem__(key, value)


# The export has beam size 3, max_extra_length 8, max_source_tokens 32 (the program's bound).
@pytest.mark.parametrize(
    "edit, message",
    [
        (
            _set("serving", "max_source_length", 64),
            "serving.max_source_length is 64, but {program} takes sources of at most 32 tokens",
        ),
        (
            lambda c: c["serving"].update(max_source_length=512, max_source_tokens=512),
            "serving.max_source_length is 512, but {program} takes sources of at most 32 tokens",
        ),
        (_set("serving", "max_source_tokens", 40), "serving.max_source_tokens 40 makes rows of 48 tokens"),
        (_set("serving", "length_bucket", 0), "serving.length_bucket is 0; it must be an integer >= 1"),
        (_set("serving", "length_bucket", "16"), "serving.length_bucket is '16'; it must be an integer >= 1"),
        (_set("serving", "batch_size", 0), "serving.batch_size is 0; it must be an integer >= 1"),
        (_set("serving", "max_source_tokens", 1), "serving.max_source_tokens is 1; it must be an integer >= 2"),
        (lambda c: c["serving"].pop("batch_size"), "serving.batch_size is None"),
        (_set("decoding", "beam_size", 8), "decoding.beam_size is 8, but {program} returns 3 hypotheses"),
        (_set("decoding", "max_extra_length", 50), "decoding.max_extra_length is 50, but {program} adds 8 tokens"),
        (_set("model", "vocab_size", True), "model.vocab_size is True"),
        (_set("model", "max_positions", 1), "model.max_positions is 1; it must be an integer >= 2"),
        (_set("model", "max_positions", "50"), "model.max_positions is '50'; it must be an integer >= 2"),
        (_set("special_tokens", "pad", -1), "special_tokens.pad is -1"),
        (_set("files", "loader", "serve.py"), "files.loader is 'serve.py', not serve.py's name"),
        (lambda c: c["files"]["loader"].update(imports="sentence_batches.py"), "files.loader is {"),
        (_set("files", "parameters", "params.safetensors"), "files.parameters is 'params.safetensors'"),
        (lambda c: c["files"]["program"].pop("sha256"), "files.program is {'name': 'beam_search.jaxexport'}"),
        (lambda c: c["files"]["tokenizer"].update(name=".."), "files.tokenizer is {'name': '..'"),
        (lambda c: c.pop("files"), "files.loader is None"),
        (
            _set("model", "source_vocab_size", 50),
            "model.source_vocab_size is 50 (separate vocabularies), but files lacks a target_tokenizer",
        ),
    ],
)
def test_an_edited_config_value_is_named_with_its_value(exported, tmp_path, edit, message):
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    _edit_config(copy, edit)
    expected = f"{copy / 'config.json'}: " + message.replace("{program}", str(copy / "beam_search.jaxexport"))
    for load, error_type in ((standalone.load, standalone.ExportError), (load_export, ExportError)):
        with pytest.raises(error_type) as error:
            load(copy)
        assert str(error.value).startswith(expected) and "\n" not in str(error.value), str(error.value)


def test_a_tokenizer_that_disagrees_with_config_json_names_both(exported, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    size = json.loads((copy / "config.json").read_text())["model"]["vocab_size"]
    _edit_config(copy, _set("model", "vocab_size", size - 1))
    with pytest.raises(standalone.ExportError) as error:
        standalone.load(copy)
    assert str(error.value) == (
        f"{copy / 'tokenizer.model'} has {size} pieces, but {copy / 'config.json'} gives the model "
        f"model.vocab_size={size - 1}"
    )
    _edit_config(copy, lambda c: c["model"].update(vocab_size=size) or c["special_tokens"].update(eos=2, bos=1))
    with pytest.raises(standalone.ExportError) as error:
        standalone.load(copy)
    assert str(error.value) == (
        f"{copy / 'tokenizer.model'}: its (pad, eos, bos) ids (0, 1, 3) differ from config.json's special_tokens "
        "(0, 2, 1)"
    )


def test_serve_py_names_an_edited_bound_before_translating(exported, tmp_path):
    """The audit's case: a raised bound loaded, then failed with a traceback on a long line."""
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    _edit_config(copy, lambda c: c["serving"].update(max_source_length=512, max_source_tokens=512))
    result = run_serve_py(copy, input="A man. " * 200 + "\n")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: {copy / 'config.json'}: serving.max_source_length is 512, but {copy / 'beam_search.jaxexport'} "
        "takes sources of at most 32 tokens\n"
    )


def test_values_the_program_allows_still_load(exported, tmp_path):
    """Serving choices within the program's bounds, and the loader entries of older exports
    (helpers by name, no digest for serve.py), are not edits to refuse."""
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)

    def edit(config):
        config["serving"].update(batch_size=2, max_source_tokens=20)  # rows of 32: the bound
        config["files"]["loader"] = {"name": "serve.py", "imports": ["sentence_batches.py"]}

    _edit_config(copy, edit)
    model = standalone.load(copy)
    assert (model.batch_size, model.max_source_tokens, model.max_source_length) == (2, 20, 32)
    with pytest.raises(
        ValueError, match="^batch_size must be an integer >= 1, got 0$"
    ):  # the value used, not the argument
        standalone.ExportedTranslator(model.config | {"serving": {"batch_size": 0}}, {}, None, model.program)


def test_a_batch_size_that_is_no_positive_integer_is_refused_before_the_export_is_read(
    exported,
    monkeypatch,
    symbolic_shapes_unchecked,  # Translator's beartype checks off, as a user runs
):
    """serve.load and Translator.from_export cast batch_size with int(): 2.7 ran batches of 2, "4"
    of 4 and True of 1, where Translator refuses each. Now refused as Translator refuses them,
    before any parameter is read."""

    def unread(*args):
        raise AssertionError("the export was read")

    monkeypatch.setattr(standalone, "_read_files", unread)
    for batch_size in (2.7, "4", True, 0, -1):
        for load in (standalone.load, Translator.from_export):
            with pytest.raises(
                ValueError, match=rf"^batch_size must be an integer >= 1, got {re.escape(repr(batch_size))}$"
            ):
                load(exported, batch_size=batch_size)


@pytest.mark.parametrize(
    "add, first",
    [
        (lambda d: (d / "NOTES.txt").write_text("mine"), "NOTES.txt"),
        (lambda d: (d / "outputs").mkdir() or (d / "outputs" / "a.de").write_text("mine"), "outputs"),
        (
            lambda d: (d / "__pycache__").mkdir() or (d / "__pycache__" / "notes.txt").write_text("x"),
            "__pycache__/notes.txt",
        ),
        (
            lambda d: (d / "__pycache__").mkdir() or (d / "__pycache__" / "mine.cpython-311.pyc").write_text("x"),
            "__pycache__/mine.cpython-311.pyc",
        ),
    ],
)
def test_overwrite_refuses_an_export_beside_other_files(exported, workdir, tmp_path, capsys, monkeypatch, add, first):
    output = tmp_path / "served"
    shutil.copytree(exported, output)
    add(output)
    before = sorted(str(path.relative_to(output)) for path in output.rglob("*"))

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    assert export.main(["--workdir", str(workdir), "--output", str(output), "--overwrite"]) == 2
    error = capsys.readouterr().err
    assert error == (
        f"error: --output {output}: holds {output / first}, which is not part of the export in it; "
        "not replacing it, even with --overwrite (move it elsewhere first)\n"
    )
    assert sorted(str(path.relative_to(output)) for path in output.rglob("*")) == before


def test_an_output_that_is_a_symbolic_link_is_refused_before_any_work(workdir, tmp_path, capsys, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    for flags in ([], ["--overwrite"]):
        assert export.main(["--workdir", str(workdir), "--output", str(tmp_path / "link"), *flags]) == 2
        assert capsys.readouterr().err == (
            f"error: --output {tmp_path / 'link'}: is a symbolic link (to {tmp_path / 'real'}); give the folder "
            "itself\n"
        )
    assert (tmp_path / "link").is_symlink() and not any((tmp_path / "real").iterdir())


def test_an_output_that_cannot_be_made_is_refused_before_any_work(workdir, tmp_path, capsys, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    (tmp_path / "afile").write_text("x")
    for output, message in (
        (
            tmp_path / "afile" / "sub",
            f"error: --output {tmp_path / 'afile' / 'sub'}: cannot write it: {tmp_path / 'afile'}: "
            "is a file, not a folder",
        ),
        (  # named once (was: "/proc: /proc takes no new entries")
            "/proc/jaxformer-export",
            "error: --output /proc/jaxformer-export: cannot write it: /proc takes no new entries (",
        ),
        ("", "error: argument --output: must be a path, got an empty one"),
        ("gs://bucket/e", "error: argument --output: must be a local path or a mounted file system"),
    ):
        try:
            status = export.main(["--workdir", str(workdir), "--output", str(output)])
        except SystemExit as exit:  # a flag's error, from argparse
            status = exit.code
        assert status == 2
        error = capsys.readouterr().err
        assert error.startswith(message) and error.count("\n") == 1, error
    assert not (tmp_path / "gs:").exists() and (tmp_path / "afile").read_text() == "x"


def test_overwrite_replaces_an_export_that_python_has_run(
    exported, workdir, tmp_path, capsys, symbolic_shapes_unchecked
):
    """serve.py and its helper compiled into __pycache__ by a run are the export's own files. A
    step is named as translate names it ("checkpoint 1", not "1 checkpoint")."""
    output = tmp_path / "served"
    shutil.copytree(exported, output)
    (output / "__pycache__").mkdir()
    for name in ("serve.cpython-311.pyc", "sentence_batches.cpython-311.pyc"):
        (output / "__pycache__" / name).write_bytes(b"compiled")
    flags = ["--workdir", str(workdir), "--checkpoint", "1", "--output", str(output), "--overwrite"]
    assert export.main([*flags, "--platforms", "cpu", *FLAGS]) == 0
    assert f"exported step 1 of {workdir} (checkpoint 1) to {output} for cpu\n" in capsys.readouterr().out
    assert json.loads((output / "config.json").read_text())["platforms"] == ["cpu"]
    assert not (output / "__pycache__").exists() and os.listdir(tmp_path) == ["served"]


def test_repeated_platforms_are_refused(workdir, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        export.main(["--workdir", str(workdir), "--output", str(tmp_path / "out"), "--platforms", "cpu,tpu,cpu"])
    assert stop.value.code == 2
    assert "argument --platforms: names cpu more than once; got 'cpu,tpu,cpu'" in capsys.readouterr().err
    with pytest.raises(ExportError, match="platforms cpu, cpu: cpu given more than once"):
        exporter.export_checkpoint(workdir, tmp_path / "out", platforms=("cpu", "cpu"))
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_choice_of_another_type_is_refused_before_any_work(workdir, tmp_path, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "require_architecture", no_work)
    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    with pytest.raises(TypeError) as raised:
        exporter.export_checkpoint(workdir, tmp_path / "out", checkpoint=True)  # was step True, read as 1
    assert str(raised.value) == (
        "checkpoint=True: give latest, best, averaged, final or a step number (an int, or its digits as a str)"
    )
    assert not (tmp_path / "out").exists()


def test_a_program_without_jax_exports_bound_wording_loads_with_that_bound_unchecked(exported):
    """The source-length bound is read from jax.export's assertion text in the artifact; an
    artifact worded otherwise (another jax) still loads, with its beam and lengths checked."""
    import types

    model = standalone.load(exported)
    program = model.program
    assert b"symbolic shape constraint S <= " in program.mlir_module_serialized
    reworded = types.SimpleNamespace(
        in_tree=program.in_tree,
        in_avals=program.in_avals,
        out_avals=program.out_avals,
        mlir_module_serialized=b"worded otherwise",
    )
    config = json.loads((exported / "config.json").read_text())
    config["serving"]["max_source_length"] = 10_000
    export_program.check_program_shapes(config, reworded, "config.json", "program")  # the bound unchecked
    with pytest.raises(standalone.ExportError, match="serving.max_source_length is 10000, but program takes"):
        export_program.check_program_shapes(config, program, "config.json", "program")
    config["decoding"]["beam_size"] += 1
    with pytest.raises(standalone.ExportError, match="decoding.beam_size is"):
        export_program.check_program_shapes(config, reworded, "config.json", "program")


def test_an_output_that_holds_the_current_folder_is_refused_before_any_work(workdir, tmp_path, capsys, monkeypatch):
    """The export is renamed into place: `--output .` would take the folder from under the shell."""

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    inner = tmp_path / "out" / "inner"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)
    for output in (".", "..", str(inner)):
        assert export.main(["--workdir", str(workdir), "--output", output, "--overwrite"]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: --output ") and "holds the current folder" in error, error
        assert error.count("\n") == 1
    assert inner.is_dir() and not any(inner.iterdir())


def test_an_absolute_output_exports_from_a_removed_current_folder(workdir, tmp_path, monkeypatch):
    """The check that the output does not hold the current folder needs no current folder."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    output_folder.check_output(tmp_path / "out", overwrite=False)  # no FileNotFoundError from the current folder


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_that_overwrite_would_not_replace_is_named_so_without_it(overwrite, tmp_path):
    """Without --overwrite a folder holding no export, or more than one, said "pass --overwrite",
    which then refused it: the way out it named was none."""
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "mine.txt").write_text("keep me")
    with pytest.raises(ExportError) as raised:
        output_folder.check_output(stranger, overwrite=overwrite)
    assert str(raised.value) == (
        f"--output {stranger}: holds something other than a jaxformer export (no readable config.json); "
        "not replacing it, even with --overwrite: give a new or empty folder"
    )
    beside = tmp_path / "served"
    beside.mkdir()
    (beside / "config.json").write_text(json.dumps({"format": standalone.FORMAT, "files": {}}))
    (beside / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match=r"holds .*notes\.txt, which is not part of the export in it; not replacing"):
        output_folder.check_output(beside, overwrite=overwrite)
    (beside / "notes.txt").unlink()
    if overwrite:
        output_folder.check_output(beside, overwrite=True)  # an export alone: replaced
    else:
        with pytest.raises(ExportError, match=r"is not empty; pass --overwrite to replace the export in it$"):
            output_folder.check_output(beside, overwrite=False)
