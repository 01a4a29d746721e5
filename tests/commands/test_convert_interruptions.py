"""A Ctrl-C while jaxformer-convert writes its output ends it as every Ctrl-C does (`interrupted`,
130), with nothing half-written left: one that torch or transformers dropped (Python's
KeyboardInterrupt raised inside their code) let the command go on and exit 0, and one that ended it
left the files written so far, which the next conversion refused as a folder in use. The stand-in
for import_marian writes as it does, through marian_output.written_whole (the staging folder that
is renamed into place; tests/interop/test_convert_staging.py has the real one killed)."""

import os
import signal
import tempfile
import time
import types

import pytest

from jaxformer.commands import convert
from jaxformer.interop import marian, marian_output

CONVERTED = types.SimpleNamespace(
    config=types.SimpleNamespace(num_encoder_layers=1, num_decoder_layers=1, d_model=8, vocab_size=16),
    search_flags=[],
    unreproduced=[],
)


@pytest.mark.parametrize("dropped", [True, False])
@pytest.mark.parametrize("made_empty", [False, True])
def test_a_ctrl_c_while_the_output_is_written_leaves_none(dropped, made_empty, tmp_path, capsys, monkeypatch):
    output = tmp_path / "run"
    if made_empty:
        output.mkdir()

    def import_marian(directory, workdir, *languages, on_placed=None):
        folder = marian_output.check_new_output(workdir, marian_output.RUN)
        with marian_output.written_whole(folder, marian_output.RUN, on_placed) as written:
            (written / "config.json").write_text("{}")
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here
            except BaseException:
                if not dropped:
                    raise
            (written / "model.safetensors").write_text("weights")
        return CONVERTED

    monkeypatch.setattr(marian, "import_marian", import_marian)
    (tmp_path / "hf").mkdir()
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--output", str(output)]) == 130
    assert capsys.readouterr() == ("", "interrupted\n")
    assert (list(output.iterdir()) == []) if made_empty else not output.exists()
    assert sorted(os.listdir(tmp_path)) == (["hf", "run"] if made_empty else ["hf"])  # no staging folder left


def test_a_ctrl_c_as_an_empty_output_is_probed_leaves_it_empty(tmp_path, capsys, monkeypatch):
    """Ctrl-C between the probe's mkdir and its rmdir (whether --output takes new entries): the
    probe is removed (was: a `.jaxformer-probe-*` folder left in --output, which the next convert
    refused as not an empty directory)."""
    output = tmp_path / "run"
    output.mkdir()
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp_then_ctrl_c(*args, **kwargs):
        path = real_mkdtemp(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return path

    def import_marian(directory, workdir, *languages, on_placed=None):
        marian_output.check_new_output(workdir, marian_output.RUN)
        raise AssertionError("the conversion went on after the Ctrl-C")

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_ctrl_c)
    monkeypatch.setattr(marian, "import_marian", import_marian)
    (tmp_path / "hf").mkdir()
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--output", str(output)]) == 130
    assert capsys.readouterr() == ("", "interrupted\n")
    assert list(output.iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["hf", "run"]


def test_an_output_in_use_is_never_emptied(tmp_path, capsys):
    output = tmp_path / "run"
    output.mkdir()
    (output / "mine.txt").write_text("kept")
    (tmp_path / "hf").mkdir()
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--output", str(output)]) == 2
    assert "already exists and is not an empty directory" in capsys.readouterr().err
    assert (output / "mine.txt").read_text() == "kept"
