"""translate, run as a user runs it: files, stdin to stdout (a pipe, a terminal), a bad line, sampling's seed."""

import os
import pathlib
import pty
import select
import subprocess
import sys
import time

import pytest

from jaxformer.commands import translate
from jaxformer.decoding.translator import Translator
from tests.commands.test_commands import FAST, translate_settings
from tests.conftest import read_raw
from tests.training.test_loop import environment

pytestmark = pytest.mark.xdist_group("decoding-workdir")
ROOT = pathlib.Path(__file__).parents[2]
# What translate and generate say on stderr, as a log line, before they wait for lines typed on a terminal.
TERMINAL_HINT = "from the terminal, one per line; end with Ctrl-D (or give --input FILE)"


def run_on_a_terminal(command, typed):
    """`python -m jaxformer.commands.<command>` with a pseudo-terminal as stdin: once its stderr
    says it reads the terminal (TERMINAL_HINT; at most a minute), `typed` and Ctrl-D are typed,
    as a user types them. (exit code, stdout, stderr, whether it said so before the typing)."""
    keyboard, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", f"jaxformer.commands.{command[0]}", *command[1:]],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(environment(), PYTHONPATH=str(ROOT)),
    )
    os.close(terminal)
    try:
        said, deadline = b"", time.monotonic() + 60
        while (
            TERMINAL_HINT.encode() not in said
            and select.select([process.stderr], [], [], max(deadline - time.monotonic(), 0))[0]
        ):
            chunk = os.read(process.stderr.fileno(), 4096)
            if not chunk:
                break
            said += chunk
        asked_first = TERMINAL_HINT.encode() in said
        os.write(keyboard, typed.encode() + b"\x04")  # Ctrl-D at a line's start: the end of the input
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(keyboard)
    return process.returncode, out.decode(), (said + err).decode(), asked_first


@pytest.mark.slow  # 1,000 lines; stdin to stdout is checked on a few below
def test_translate_round_trips_1000_lines(decoding_workdir, tmp_path):
    lines = read_raw("train.en.gz", 990)
    lines[10] = lines[500] = ""  # empty lines
    lines[20] = "   "
    lines[700] = " ".join(read_raw("val.en.gz", 60))  # ~800 tokens: beyond max_source_tokens
    lines[701] = "x" * 3000  # one unbroken 'word'
    lines += read_raw("val.en.gz", 10)
    assert len(lines) == 1000
    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert (
        translate.main(
            [
                "--workdir",
                str(decoding_workdir),
                "--input",
                str(source),
                "--output",
                str(output),
                "--batch_size",
                "128",
                "--no_progress",
                *FAST,
            ]
        )
        == 0
    )
    translations = output.read_text(encoding="utf-8").split("\n")
    assert translations[-1] == "" and len(translations) == 1001  # 1000 lines, each ending in a newline
    translations = translations[:-1]
    assert translations[10] == translations[20] == translations[500] == ""
    assert translations[700] and translations[701]
    # Order: sampled lines equal their translation on their own.
    translator = Translator.from_workdir(decoding_workdir, settings=translate_settings())
    for index in (0, 1, 333, 699, 998, 999):
        assert translations[index] == translator.translate([lines[index]])[0], index


def test_translate_reads_stdin_and_writes_stdout(decoding_workdir):
    lines = ["A man sleeps.", "", "Two dogs run on the beach."]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "--workdir", str(decoding_workdir), "--no_progress", *FAST],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == 3 and outputs[1] == ""
    assert TERMINAL_HINT not in result.stderr  # a pipe is read without a word
    assert (
        outputs[0] == Translator.from_workdir(decoding_workdir, settings=translate_settings()).translate([lines[0]])[0]
    )


def test_translate_says_it_reads_the_terminal_before_it_waits_there(decoding_workdir):
    """Without --input, on a terminal, translate waited without a word: a user who forgot --input
    saw nothing. Now one log line on stderr says what it waits for; stdout holds the translations alone."""
    flags = ["--workdir", str(decoding_workdir), *FAST]
    code, out, err, asked_first = run_on_a_terminal(["translate", *flags], "A man sleeps.\n")
    assert asked_first, err[-3000:]
    assert code == 0, err[-3000:]
    hint = [line for line in err.splitlines() if TERMINAL_HINT in line]
    assert len(hint) == 1 and hint[0].endswith(f" I reading sentences {TERMINAL_HINT}")
    translator = Translator.from_workdir(decoding_workdir, settings=translate_settings())
    assert out == translator.translate(["A man sleeps."])[0] + "\n"


def test_translate_names_a_bad_line(decoding_workdir, tmp_path, capsys):
    source = tmp_path / "bad.en"
    source.write_bytes(b"fine\nbroken \xff byte\n")
    assert translate.main(["--workdir", str(decoding_workdir), "--input", str(source), *FAST]) == 2
    assert capsys.readouterr().err == f"error: {source}: line 2 is not valid UTF-8 (invalid start byte at byte 7)\n"
    verbose = ["--workdir", str(decoding_workdir), "--input", str(source), "--verbose", *FAST]
    assert translate.main(verbose) == 2  # --verbose adds the traceback, not another exit code
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "DataError" in err
    assert err.endswith(f"error: {source}: line 2 is not valid UTF-8 (invalid start byte at byte 7)\n")


def test_translate_samples_with_the_seed_it_is_given(decoding_workdir, tmp_path, capsys):
    source = tmp_path / "in.en"
    source.write_text("A man sleeps.\nTwo dogs run on the beach.\nA girl reads a book in the park.\n")
    sample = ["--workdir", str(decoding_workdir), "--input", str(source), "--method", "sample", "--no_progress"]

    def sampled(*flags):
        assert translate.main([*sample, "--max_extra_length", "12", *flags]) == 0
        return capsys.readouterr().out

    outputs = {seed: sampled("--seed", str(seed)) for seed in range(4)}
    assert sampled() == outputs[0]  # the default seed
    assert sampled("--seed", "2") == outputs[2]
    assert len(set(outputs.values())) > 1  # twelve tokens of three sentences from an untrained model
    assert translate.main(["--workdir", str(decoding_workdir), "--input", str(source), "--seed", "3", *FAST]) == 2
    assert capsys.readouterr().err == "error: --seed 3 applies to --method sample, not greedy\n"
