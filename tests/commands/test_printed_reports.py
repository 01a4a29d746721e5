"""What evaluate and average_checkpoints print, on a stdout whose encoding cannot hold a path."""

import io
import json
import shutil
import sys

import pytest

from jaxformer.commands import average_checkpoints, evaluate
from tests.commands.test_commands import FAST, EchoingTranslator
from tests.conftest import read_raw

pytestmark = pytest.mark.xdist_group("decoding-workdir")
NAME = "Prüfung 試験"  # outside ASCII and Latin-1, the encodings of legacy locales


def ascii_stdout(monkeypatch) -> io.TextIOWrapper:
    """sys.stdout as a locale without UTF-8 (PYTHONIOENCODING=ascii) sets it up."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stdout)
    return stdout


def printed(stdout: io.TextIOWrapper) -> list[str]:
    stdout.flush()
    return stdout.buffer.getvalue().decode("utf-8").splitlines()


def test_evaluate_prints_its_scores_in_utf8_after_writing_its_files(decoding_workdir, tmp_path, monkeypatch):
    source, reference = tmp_path / f"{NAME}.en", tmp_path / f"{NAME}.de"
    source.write_text("\n".join(read_raw("val.en.gz", 3)) + "\n", encoding="utf-8")
    reference.write_text("\n".join(read_raw("val.de.gz", 3)) + "\n", encoding="utf-8")
    hypotheses, scores_file = tmp_path / "hyp.de", tmp_path / "scores.json"
    monkeypatch.setattr(evaluate, "translator_from_flags", lambda args, settings, *rest: EchoingTranslator(settings))
    stdout = ascii_stdout(monkeypatch)
    files = ["--source", str(source), "--reference", str(reference), "--output", str(hypotheses)]
    assert evaluate.main(["--workdir", str(decoding_workdir), *files, "--json", str(scores_file), *FAST]) == 0
    lines = printed(stdout)
    assert lines[0].startswith(f"{source}: 3 sentences") and [line.split()[0] for line in lines[1:]] == [
        "BLEU",
        "chrF",
        "lowercase",
    ]
    scores = json.loads(scores_file.read_text())
    assert scores["data"] == str(source) and scores["reference"] == str(reference)  # what the scores were taken against
    assert hypotheses.read_text(encoding="utf-8").splitlines() == read_raw("val.en.gz", 3)


def test_average_checkpoints_prints_the_folder_in_utf8(decoding_workdir, tmp_path, monkeypatch):
    workdir = tmp_path / NAME
    shutil.copytree(decoding_workdir / "checkpoints", workdir / "checkpoints")
    stdout = ascii_stdout(monkeypatch)
    assert average_checkpoints.main(["--workdir", str(workdir), "--last", "1"]) == 0
    assert printed(stdout) == [f"averaged steps [1] into {workdir / 'averaged' / '1'}"]
