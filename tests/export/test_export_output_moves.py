"""Putting an export in place: into a mount point (a Docker volume, a bind mount), which no rename
can move or replace, and a final move that fails, which leaves the old export in place and
nothing beside it."""

import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from jaxformer import staged_folder
from jaxformer.commands import export
from jaxformer.export import exporter, output_folder
from jaxformer.export.loading import ExportError, load_export
from tests.export.exports import FLAGS

pytestmark = pytest.mark.xdist_group("export")  # the workdir fixture of conftest.py, made once


def _refuse_renames(monkeypatch, fails):
    """os.replace raising OSError(`fails(source, target)`) where that gives an errno."""
    real_replace = os.replace

    def replace(source, target):
        code = fails(pathlib.Path(source), pathlib.Path(target))
        if code:
            raise OSError(code, os.strerror(code), str(source), None, str(target))
        real_replace(source, target)

    monkeypatch.setattr(staged_folder.os, "replace", replace)


@pytest.fixture
def volume(tmp_path, monkeypatch):
    """tmp_path/volume, an empty folder that is a mount point: is_mount_point says so, and renames
    fail as the kernel's do: of the mount point itself EBUSY, across its boundary EXDEV."""
    volume = tmp_path / "volume"
    volume.mkdir()

    def fails(source, target):
        if volume in (source, target):
            return errno.EBUSY
        return errno.EXDEV if (volume in source.parents) != (volume in target.parents) else 0

    _refuse_renames(monkeypatch, fails)
    monkeypatch.setattr(staged_folder, "is_mount_point", lambda path: pathlib.Path(path) == volume)
    return volume


def test_an_export_goes_into_a_mount_point_and_replaces_the_one_there(
    volume, workdir, capsys, symbolic_shapes_unchecked
):
    flags = ["--workdir", str(workdir), "--output", str(volume), "--platforms", "cpu", *FLAGS]
    assert export.main(flags) == 0, capsys.readouterr().err
    assert f"to {volume} for cpu" in capsys.readouterr().out
    assert json.loads((volume / "config.json").read_text())["checkpoint"]["which"] == "latest"
    names = sorted(os.listdir(volume))
    assert "serve.py" in names and not [name for name in names if name.startswith(".")]

    (volume / "__pycache__").mkdir()  # serve.py run there
    (volume / "__pycache__" / "serve.cpython-311.pyc").write_bytes(b"compiled")
    assert export.main([*flags, "--checkpoint", "best", "--overwrite"]) == 0, capsys.readouterr().err
    assert json.loads((volume / "config.json").read_text())["checkpoint"]["which"] == "best"
    assert sorted(os.listdir(volume)) == names and os.listdir(volume.parent) == ["volume"]
    load_export(volume)


def test_a_read_only_mount_point_is_refused_before_any_work(volume, workdir, capsys, monkeypatch):
    """The export is staged inside a mount point, so that folder must take new entries (its parent
    may well, and be of no use)."""

    def unwritable(path):
        return f"{volume} takes no new entries (Read-only file system)" if pathlib.Path(path) == volume else None

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(staged_folder, "unwritable_folder_reason", unwritable)
    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    assert export.main(["--workdir", str(workdir), "--output", str(volume)]) == 2
    assert capsys.readouterr().err == (
        f"error: --output {volume}: cannot write it: {volume} takes no new entries (Read-only file system)\n"
    )
    assert os.listdir(volume.parent) == ["volume"] and not os.listdir(volume)


def _tree(directory):
    return {str(path.relative_to(directory)): path.is_file() and path.read_text() for path in directory.rglob("*")}


def _make(directory, tree):
    """`directory` holding `tree` ({relative path: text, or False for a folder}) and nothing else."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for name, text in sorted(tree.items()):
        if text is False:
            (directory / name).mkdir()
        else:
            (directory / name).write_text(text)


OLD_EXPORT = {"config.json": "old", "serve.py": "old", "__pycache__": False, "__pycache__/serve.cpython-311.pyc": "old"}
NEW_EXPORT = {"config.json": "new", "serve.py": "new", "params.safetensors": "new"}


@pytest.mark.parametrize("inside", [False, True], ids=["beside", "inside a mount point"])
@pytest.mark.parametrize("old", [{}, OLD_EXPORT], ids=["new", "replacing"])
def test_a_final_move_that_fails_is_one_line_and_leaves_everything_as_it_was(tmp_path, monkeypatch, inside, old):
    """Each rename of the final move failing in turn: the ones before it are undone, the output
    holds what it held, and no staging or retired folder is left beside it or in it."""
    output = tmp_path / "export"
    staging = (output if inside else tmp_path) / ".export.x.partial"
    renames, failing = [], 0

    def fails(source, target):
        renames.append((source, target))
        return errno.EIO if len(renames) == failing else 0

    _refuse_renames(monkeypatch, fails)
    _make(output, old)
    _make(staging, NEW_EXPORT)
    staged_folder.move_into_place(staging, output, output_folder.EXPORT)  # none failing: counts the renames
    assert _tree(output) == {**({".export.x.partial": False} if inside else {}), **NEW_EXPORT}
    count = len(renames)
    assert count == (3 + (3 if old else 0) if inside else (2 if old else 1))
    for failing in range(1, count + 1):
        _make(output, old)
        _make(staging, NEW_EXPORT)
        renames.clear()
        with pytest.raises(ExportError) as error:
            staged_folder.move_into_place(staging, output, output_folder.EXPORT)
        assert str(error.value) == f"cannot move the export into {output}: {os.strerror(errno.EIO)}"
        assert _tree(staging) == NEW_EXPORT
        shutil.rmtree(staging)  # as staging_directory does
        assert _tree(output) == old, failing
        assert os.listdir(tmp_path) == ["export"]


def test_an_undetected_mount_point_is_one_line_that_says_what_to_do(tmp_path, monkeypatch):
    """A mount point that is_mount_point misses (a system without /proc/self/mountinfo) fails at
    the final rename: EBUSY, said in one line with what to give instead."""
    output, staging = tmp_path / "export", tmp_path / ".export.x.partial"
    for directory in (output, staging):
        directory.mkdir()
    (staging / "config.json").write_text("new")
    _refuse_renames(monkeypatch, lambda source, target: errno.EBUSY if output in (source, target) else 0)
    with pytest.raises(ExportError) as error:
        staged_folder.move_into_place(staging, output, output_folder.EXPORT)
    assert str(error.value) == (
        f"cannot move the export into {output}: {os.strerror(errno.EBUSY)} ({output} is in use, a mount point?): "
        f"give a folder inside it, e.g. {output / 'export'}"
    )


def _bind_mount(source, target, command):
    """`command` run where `source` is bind-mounted on `target` (in a mount namespace of its own:
    nothing outside it sees the mount); skips the test where that is not permitted."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare command")
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", source, target], capture_output=True)
    if probe.returncode:
        pytest.skip(f"a bind mount in a mount namespace is not permitted here: {probe.stderr.decode().strip()}")
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", source, target, *command],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_is_mount_point_sees_a_bind_mount_of_the_same_file_system(tmp_path):
    """os.path.ismount does not: the mount point's device is its parent's."""
    from jaxformer.files import is_mount_point

    (tmp_path / "source").mkdir()
    target = tmp_path / "a volume"  # a space, which /proc/self/mountinfo writes as \040
    target.mkdir()
    check = "import sys; from jaxformer.files import is_mount_point; print(is_mount_point(sys.argv[1]))"
    result = _bind_mount(str(tmp_path / "source"), str(target), [sys.executable, "-c", check, str(target)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"
    assert not is_mount_point(target) and not is_mount_point(tmp_path) and is_mount_point("/")


@pytest.mark.slow
def test_the_command_exports_into_a_bind_mount(workdir, tmp_path):
    """As a user exports into a Docker volume: the command itself, in a real bind mount."""
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    command = shutil.which("jaxformer-export", path=os.path.dirname(sys.executable))
    flags = ["--workdir", str(workdir), "--output", str(target), "--platforms", "cpu", *FLAGS]
    for extra in ([], ["--checkpoint", "best", "--overwrite"]):
        result = _bind_mount(str(source), str(target), [command, *flags, *extra])
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"to {target} for cpu" in result.stdout
    assert json.loads((source / "config.json").read_text())["checkpoint"]["which"] == "best"
    assert not [name for name in os.listdir(source) if name.startswith(".")]
    assert sorted(os.listdir(tmp_path)) == ["source", "target"] and not os.listdir(target)
