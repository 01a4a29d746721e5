"""--torch where torch does not import (not installed, or a broken install): the torch rows are
skipped with one note naming the extra, and a bad value given with --torch is still the one
error line, without the note."""

import argparse
import builtins
import sys

import pytest

import benchmarks
from benchmarks import command_line
from tests.benchmarks.test_command_line import no_work, refused  # noqa: F401  (no_work: autouse here too)


@pytest.mark.parametrize(
    "failure", [ImportError("libtorch_cpu.so: cannot open shared object file"), OSError("WinError 126")]
)
def test_torch_that_does_not_import_is_skipped_with_one_line(failure, monkeypatch, capsys):
    """torch found on the path but failing to import (a broken install) is absent: a note naming the
    extra and no torch rows, not a traceback after the flags were taken."""
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise failure
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing_import)
    monkeypatch.delitem(sys.modules, "benchmarks.torch_reference", raising=False)  # imports torch again
    monkeypatch.delattr(benchmarks, "torch_reference", raising=False)
    assert not command_line.check_torch(argparse.Namespace(torch=True, torch_threads=None))
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: --torch given but torch"), captured.err
    assert "pip install 'jaxformer[torch]'" in lines[0] and "skipping torch rows" in lines[0]
    assert not captured.out


# (benchmark, argv) with --torch: refused after check_torch could print its note
TORCH_AND_BAD_VALUES = [
    ("real_data", ["--torch", "--repeats", "2", "--iters", "2"]),
    ("real_data", ["--torch", "--pairs", "1000000"]),
    ("decoding", ["--torch", "--library", "--length", "8", "--source-length", "8"]),
]


@pytest.mark.parametrize("name, argv", TORCH_AND_BAD_VALUES, ids=[" ".join([n, *a]) for n, a in TORCH_AND_BAD_VALUES])
def test_a_bad_value_with_torch_absent_is_one_line_without_the_note(name, argv, monkeypatch, capsys):
    monkeypatch.setattr(command_line, "torch_available", lambda: False)
    assert "note:" not in refused(name, argv, capsys)
