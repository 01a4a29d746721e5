"""jaxformer-convert's paths are named by their flags, as every command's are (`--workdir X: ...`):
--from_hf's missing folder was "X is not a directory", naming no flag, and an --output in use
"X already exists and is not an empty directory: choose a new --output"."""

import errno
import os
import pathlib
import tempfile

import pytest

from jaxformer.commands import convert
from jaxformer.errors import EXIT_USER_ERROR
from jaxformer.interop import marian_output


def refusal(argv, capsys) -> str:
    assert convert.main(argv) == EXIT_USER_ERROR
    captured = capsys.readouterr()
    assert not captured.out and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_a_from_hf_that_is_no_folder_is_named_by_its_flag(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    missing, afile, output = tmp_path / "missing", tmp_path / "afile", tmp_path / "run"
    assert refusal(["--from_hf", str(missing), "--output", str(output)], capsys) == (
        f"error: --from_hf {missing}: no such directory\n"
    )
    assert refusal(["--from_hf", str(afile), "--output", str(output)], capsys) == (
        f"error: --from_hf {afile}: not a directory (a transformers MarianMT directory is one)\n"
    )
    assert not output.exists()


def test_an_output_in_use_is_named_by_its_flag_and_kept(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("kept")
    output = tmp_path / "used"
    assert refusal(["--from_hf", str(tmp_path / "hf"), "--output", str(output)], capsys) == (
        f"error: --output {output}: already exists and is not an empty directory; give a new or empty one "
        "(nothing is replaced)\n"
    )
    assert (output / "mine.txt").read_text() == "kept"


def test_the_current_folder_as_output_is_refused_before_anything_is_read(tmp_path, capsys, monkeypatch):
    """The output is renamed into place: the current folder (an empty one, else it is in use) would be
    taken from under the shell."""
    (tmp_path / "hf").mkdir()  # empty: read only after the output's checks
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert refusal(["--from_hf", str(tmp_path / "hf"), "--output", "."], capsys).startswith(
        "error: --output .: holds the current folder: the conversion is renamed into place"
    )
    assert sorted(os.listdir(tmp_path)) == ["here", "hf"] and not os.listdir(tmp_path / "here")


@pytest.fixture
def probes(monkeypatch):
    """The folders probed for whether they take new entries (files.unwritable_folder_reason makes and
    removes a `.jaxformer-probe-*` folder there), in order; probing `refused` fails as a read-only
    folder's would."""
    real_mkdtemp, probed, refused = tempfile.mkdtemp, [], []

    def mkdtemp(*args, **kwargs):
        if kwargs.get("prefix") == ".jaxformer-probe-":
            probed.append(pathlib.Path(kwargs["dir"]))
            if probed[-1] in refused:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_mkdtemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return probed, refused


def test_the_folder_an_output_is_staged_in_is_probed_once(tmp_path, capsys, probes):
    """check_new_output probed the folder an absent --output is made in twice (then again in
    staged_folder.check_placeable), and an empty one's own folder, which the staged output replaces
    by a rename, besides. A folder that takes no new entries is still refused before anything is
    read, in one line naming it."""
    probed, refused = probes
    for output in (tmp_path / "absent", tmp_path / "empty"):
        if output.name == "empty":
            output.mkdir()
        probed.clear()
        assert marian_output.check_new_output(output, marian_output.RUN) == output
        assert probed == [tmp_path]
    (tmp_path / "hf").mkdir()  # empty: read only after the output's checks
    refused.append(tmp_path)
    probed.clear()
    assert refusal(["--from_hf", str(tmp_path / "hf"), "--output", str(tmp_path / "run")], capsys) == (
        f"error: --output {tmp_path / 'run'}: cannot write it: {tmp_path} takes no new entries "
        f"({os.strerror(errno.EROFS)})\n"
    )
    assert probed == [tmp_path] and not (tmp_path / "run").exists()
