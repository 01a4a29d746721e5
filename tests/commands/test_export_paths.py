"""jaxformer-export's --output is named by its flag, as every command's paths are (`--output X: ...`,
commands/path_checks.py): its refusals said `the output X ...` and `the output directory X ...`,
or `cannot write the export X: ...`, naming no flag. Each is refused before the checkpoint is read:
an empty folder stands for the workdir."""

import json

import pytest

from jaxformer.commands import export
from jaxformer.errors import EXIT_USER_ERROR
from jaxformer.export import standalone


def refusal(workdir, output, capsys, *flags) -> str:
    assert export.main(["--workdir", str(workdir), "--output", str(output), *flags]) == EXIT_USER_ERROR
    captured = capsys.readouterr()
    assert not captured.out and captured.err.count("\n") == 1, captured.err
    return captured.err


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "run").mkdir()
    return tmp_path / "run"


def test_outputs_that_cannot_take_an_export_are_named_by_their_flag(workdir, tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("kept")
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / standalone.CONFIG_FILE).write_text(json.dumps({"format": standalone.FORMAT, "files": {}}))
    for output, reason in (
        (tmp_path / "link", f"is a symbolic link (to {tmp_path / 'real'}); give the folder itself"),
        (tmp_path / "afile", "is a file, not a directory"),
        (tmp_path / "afile" / "sub", f"cannot write it: {tmp_path / 'afile'}: "),
        (tmp_path / "notes", "holds something other than a jaxformer export (no readable config.json)"),
        (tmp_path / "served", "is not empty; pass --overwrite to replace the export in it"),
    ):
        assert refusal(workdir, output, capsys).startswith(f"error: --output {output}: {reason}")
    assert (tmp_path / "notes" / "mine.txt").read_text() == "kept"


def test_an_output_holding_the_current_folder_is_named_by_its_flag(workdir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    assert refusal(workdir, ".", capsys, "--overwrite").startswith(
        f"error: --output {workdir}: holds the current folder: "
    )


def test_a_relative_output_in_a_removed_folder_is_named_by_its_flag(workdir, tmp_path, capsys, monkeypatch):
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")
    (tmp_path / "gone").rmdir()
    assert refusal(workdir, "out", capsys) == (
        "error: --output out: the current folder no longer exists; cd to one that does\n"
    )
