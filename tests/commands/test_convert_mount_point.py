"""jaxformer-convert into a mount point (a Docker volume), whose files it moves in one by one
(jaxformer/staged_folder.py), killed with kill -9 during those moves: the next conversion removed
the killed one's staging folder with a warning, then refused the output as "not an empty
directory", without a word on where the files in it came from or what to do. The mount point is
simulated as tests/export/test_export_output_moves.py does (is_mount_point says so)."""

import os
import pathlib
import tempfile

import pytest

from jaxformer import staged_folder
from jaxformer.commands import convert
from jaxformer.errors import EXIT_USER_ERROR
from jaxformer.interop import marian_output


class Killed(BaseException):
    """kill -9 at a rename: nothing after it runs, no rename is undone, no lock is held any longer."""


@pytest.fixture
def volume(tmp_path, monkeypatch):
    volume = tmp_path / "volume"
    volume.mkdir()
    monkeypatch.setattr(staged_folder, "is_mount_point", lambda path: pathlib.Path(path) == volume)
    (tmp_path / "hf").mkdir()
    return volume


def _killed_as_it_moved_its_files_in(volume, monkeypatch) -> tuple[pathlib.Path, list[str]]:
    """A run staged inside `volume` as a conversion stages it, then moved in by move_into_place,
    killed at its second rename: (its staging folder, what `volume` then holds)."""
    staging = pathlib.Path(tempfile.mkdtemp(dir=volume, prefix=".volume.", suffix=".partial"))
    for name in ("config.json", "spm.model"):
        (staging / name).write_text("{}")
    (staging / "checkpoints").mkdir()  # marian_output.RUN's last
    real_replace, renames = os.replace, []

    def replace(source, target):
        if renames:
            raise Killed
        renames.append(target)
        real_replace(source, target)

    with monkeypatch.context() as patched:
        patched.setattr(staged_folder.os, "replace", replace)
        with pytest.raises(Killed):
            staged_folder.move_into_place(staging, volume, marian_output.RUN)
    moved = sorted(os.listdir(volume))
    assert len(moved) == 2 and staging.name in moved and (staging / "checkpoints").is_dir()
    return staging, [name for name in moved if name != staging.name]


def test_the_refusal_says_the_files_are_from_a_conversion_killed_as_it_moved_them_in(
    volume, tmp_path, capsys, monkeypatch
):
    staging, moved = _killed_as_it_moved_its_files_in(volume, monkeypatch)
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--output", str(volume)]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.splitlines()
    assert f"removed {staging}, left by a conversion to {volume} that was killed before it was in place" in error[0]
    assert error[1:] == [
        f"error: --output {volume}: already exists and is not an empty directory: it holds part of a conversion "
        f"killed as it moved its files into it one by one ({volume} is a mount point; the staging folder it moved "
        f"them from was {staging}); delete what is in {volume}, then convert again"
    ]
    assert sorted(os.listdir(volume)) == moved  # nothing of it is removed but the staging folder


def test_a_mount_point_in_use_with_no_killed_conversion_is_refused_as_ever(volume, tmp_path, capsys):
    (volume / "mine.txt").write_text("kept")
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--output", str(volume)]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == (
        f"error: --output {volume}: already exists and is not an empty directory; give a new or empty one "
        "(nothing is replaced)\n"
    )
    assert os.listdir(volume) == ["mine.txt"]
