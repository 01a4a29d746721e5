"""jaxformer-convert writes --output whole or not at all, in both directions: staged in a hidden
folder beside it and renamed into place (jaxformer/staged_folder.py, as jaxformer-export does).
It wrote --output in place, removing it on a Python-level failure only: a kill -9 (or a power
loss) mid-write left half a run, which the next convert refused as "not an empty directory", and
nothing said it was half-written."""

import errno
import os
import pathlib
import signal
import subprocess

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from transformers import MarianTokenizer  # noqa: E402

from jaxformer.commands import convert  # noqa: E402
from jaxformer.data.tokenizer import Tokenizer  # noqa: E402
from jaxformer.errors import EXIT_NO_SPACE  # noqa: E402
from jaxformer.run.loading import load_checkpoint  # noqa: E402
from tests.child_processes import child_that_wrote  # noqa: E402
from tests.interop.marian_models import write_marian  # noqa: E402

pytestmark = pytest.mark.xdist_group("interop")  # the module's model is built once


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The input of each direction: a saved tiny MarianMT directory, and a run converted from it."""
    directory = tmp_path_factory.mktemp("marian")
    write_marian(directory)
    run = directory.parent / f"{directory.name}-run"
    assert convert.main(["--from_hf", str(directory), "--output", str(run)]) == 0
    return {"--from_hf": directory, "--to_hf": run}


@pytest.mark.parametrize("made_empty", [False, True], ids=["absent", "empty"])
@pytest.mark.parametrize("direction", ["--from_hf", "--to_hf"])
def test_a_write_that_fails_midway_never_shows_in_the_output(
    sources, direction, made_empty, tmp_path, capsys, monkeypatch
):
    """A full disk as the tokenizer is written, once the weights are: at that moment --output is
    as it was (what a kill -9 there would leave), and after it, with no staging folder beside it."""
    output = tmp_path / "output"
    if made_empty:
        output.mkdir()
    seen = []

    def save_then_fail(real):
        def save(*args, **kwargs):
            real(*args, **kwargs)  # one file written, the others to come
            seen.append(sorted(os.listdir(output)) if output.exists() else None)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return save

    if direction == "--from_hf":
        monkeypatch.setattr(Tokenizer, "save", save_then_fail(Tokenizer.save))
    else:
        monkeypatch.setattr(MarianTokenizer, "save_pretrained", save_then_fail(MarianTokenizer.save_pretrained))
    assert convert.main([direction, str(sources[direction]), "--output", str(output)]) == EXIT_NO_SPACE
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: {os.strerror(errno.ENOSPC)}: free space")
    before = [] if made_empty else None
    assert seen == [before]
    assert (sorted(os.listdir(output)) if output.exists() else None) == before
    assert os.listdir(tmp_path) == (["output"] if made_empty else [])


# The convert of a child process, its tokenizer's write made to hang once the first one is written.
HANGING_CONVERT = """
import pathlib, sys, time
from jaxformer.commands import convert
from jaxformer.data.tokenizer import Tokenizer
real = Tokenizer.save
def save_then_hang(self, path):
    real(self, path)
    pathlib.Path(sys.argv[3]).write_text(str(path))
    time.sleep(300)
Tokenizer.save = save_then_hang
sys.exit(convert.main(["--from_hf", sys.argv[1], "--output", sys.argv[2]]))
"""


def test_a_convert_killed_midway_leaves_no_output_and_the_next_one_succeeds(sources, tmp_path, capsys):
    """kill -9 while the run is written (its checkpoint and one tokenizer on disk): --output is
    absent, the killed convert's staging folder is named and removed by the next, which succeeds."""
    directory = sources["--from_hf"]
    output, marker = tmp_path / "run", tmp_path.parent / f"{tmp_path.name}.written"
    with child_that_wrote(
        marker, HANGING_CONVERT, directory, output, marker, timeout=120, stdout=subprocess.DEVNULL
    ) as child:
        written = pathlib.Path(marker.read_text())
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    assert written.is_file() and output not in written.parents  # written, but not in --output
    assert not output.exists()
    (staging,) = [path for path in tmp_path.iterdir() if path.name.endswith(".partial")]
    assert written.parent == staging

    assert convert.main(["--from_hf", str(directory), "--output", str(output)]) == 0
    error = capsys.readouterr().err
    assert f"removed {staging}, left by a conversion to {output} that was killed before it was in place" in error
    assert os.listdir(tmp_path) == ["run"]
    assert load_checkpoint(output)[0] == 0


def test_an_output_that_links_to_an_empty_folder_is_written_there(sources, tmp_path, capsys):
    """As before the staging: the folder the link points to gets the run, and the link stays."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to("folder")
    assert convert.main(["--from_hf", str(sources["--from_hf"]), "--output", str(tmp_path / "link")]) == 0
    assert (tmp_path / "link").is_symlink() and sorted(os.listdir(tmp_path)) == ["folder", "link"]
    assert load_checkpoint(tmp_path / "folder")[0] == 0
