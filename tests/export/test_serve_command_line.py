"""serve.py as a command: its flags, its reading of stdin (before the export, as translate.py
reads it, stdin closed) and its log lines. Its writing of stdout is in test_serve_write_errors.py."""

import gzip
import importlib.util
import io
import lzma
import os
import re
import sys

import pytest

from jaxformer.export import standalone
from tests.export.serving import run_serve_py

pytestmark = pytest.mark.xdist_group("export")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch_size", "2", "--batch_size", "3"], "argument --batch_size: given twice (2, then 3)"),
        (["--batch_size", "0"], "argument --batch_size: must be an integer >= 1, got '0'"),
        # a digit int() refuses: was 'invalid positive_integer value: '²''
        (["--batch_size", "²"], "argument --batch_size: must be an integer >= 1, got '²'"),
        (["--no_such_flag"], "unrecognized arguments: --no_such_flag"),
    ],
)
def test_serve_py_refuses_a_bad_command_line_in_one_line(exported, flags, message):
    result = run_serve_py(exported, *flags, input="A man.\n", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: {message}; see serve.py --help\n"


def test_serve_py_refuses_an_empty_directory_as_the_commands_refuse_an_empty_path(exported):
    """`serve.py ''` read the current folder as the export (pathlib.Path('') is '.'): run in one, it
    translated with it; now refused as the commands refuse an empty path flag, and so is load('')."""
    result = run_serve_py(exported, "", input="A man.\n", timeout=120, cwd=exported)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: argument directory: must be a path, got an empty one; see serve.py --help\n"
    with pytest.raises(standalone.ExportError, match=r"^the export's folder is given as '' \(an empty path\): give"):
        standalone.load("")


def test_serve_py_reads_a_leading_tilde_as_the_home_folder_as_the_commands_do(exported, tmp_path):
    """A quoted '~/exports/m30k' (or one after "=") reaches serve.py as written: it looked for a
    folder named "~" here. Read from config.json alone: --seed on a beam export is refused there."""
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "m30k").symlink_to(exported)
    environment = {**os.environ, "HOME": str(tmp_path)}
    for directory, message in (
        ("~/exports/m30k", "error: seed 3: this export's program is beam search, which draws nothing;"),
        ("~no_such_user_x/m30k", "error: argument directory: '~no_such_user_x/m30k' starts with ~no_such_user_x, but"),
    ):
        result = run_serve_py(exported, directory, "--seed", "3", input="A man.\n", timeout=120, env=environment)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_an_exports_home_folder_rule_is_jaxformers(exported):
    """serve.py's copy of argument_parser.py, which cannot import jaxformer.files, reads "~" as
    jaxformer.files.home_expanded does."""
    from jaxformer.files import home_expanded

    spec = importlib.util.spec_from_file_location("exported_argument_parser", exported / "argument_parser.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy.home_expanded is not home_expanded
    for path in ("~", "~/runs", "~root/runs", "~no_such_user_x/runs", "runs/~", "./~/runs", "", "runs"):
        assert copy.home_expanded(path) == home_expanded(path), path


def test_serve_py_run_through_a_link_reads_the_files_beside_the_real_one(exported, tmp_path):
    """A link to serve.py (on PATH, say) found its helpers missing beside the link."""
    (tmp_path / "serve.py").symlink_to(exported / "serve.py")
    result = run_serve_py(tmp_path, "--batch_size", "0", input="A man.\n", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: argument --batch_size: must be an integer >= 1, got '0'; see serve.py --help\n"


def test_serve_py_reads_its_input_before_the_model(exported, tmp_path):
    """Text that is not UTF-8 is named by its line, before any export is read (here: none is)."""
    for directory in (exported, tmp_path / "no-export"):
        result = run_serve_py(exported, directory, input=b"A man.\n\xff\xfe bad bytes\nTwo dogs.\n", timeout=120)
        assert result.returncode == 2 and result.stdout == b""
        assert result.stderr.decode() == "error: <stdin>: line 2 is not valid UTF-8 (invalid start byte at byte 0)\n"


def _read_by_each(data):
    """(serve.py's lines of stdin `data` or its error, translate.py's): an export reads stdin with its
    copy of text_lines.py, translate.py's reader, which it cannot import (it runs without jaxformer)."""
    from jaxformer.commands import common
    from jaxformer.data.parallel_text import DataError

    outcomes = []
    for read, refusal in (
        (standalone.stdin_lines, standalone.InputError),
        (lambda data: common.read_lines(None), DataError),  # stdin, as translate.py reads it
    ):
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
                outcomes.append(read(data))
        except refusal as error:
            outcomes.append(f"error: {error}")
    return outcomes


def test_serve_py_reads_stdin_as_translate_does():
    """A byte-order mark that starts the input, or a later line (streams joined with cat), is
    dropped, as translate.py's reader drops it (serve.py kept it, and translated a line holding
    only it); a line that is not UTF-8 is named in the same words (a character cut short by the
    line break was 'unexpected end of data')."""
    for data in (
        b"\xef\xbb\xbf\nA man.\r\n\xef\xbb\xbfTwo dogs.\n",
        b"\xef\xbb\xbfA man.",
        b"A\n\n\xef\xbb\xbf\n",
        b"",
        b"\n",
        b"A\r\r\n\r\nB",
        b"A man\rin a hat.\n",  # one \r in a line is text to both (more: lines ended by \r alone, below)
        b"caf\xc3\xa9\n",
    ):
        serve_py, translate_py = _read_by_each(data)
        assert isinstance(serve_py, list) and serve_py == translate_py, data
    for data, reason in (
        (b"A man.\n\xff\xfe bad bytes\nTwo dogs.\n", "invalid start byte at byte 0"),
        (b"A man.\ncaf\xc3\nTwo dogs.\n", "invalid continuation byte at byte 3"),  # was: unexpected end of data
        (b"A man.\r\ncaf\xc3\r\n", "invalid continuation byte at byte 3"),
        (b"A man.\ncaf\xc3", "unexpected end of data at byte 3"),  # the end of the input
        (b"\xef\xbb\xbf\xff\n", "invalid start byte at byte 0"),  # counted after the byte-order mark by both
    ):
        serve_py, translate_py = _read_by_each(data)
        line = 1 if data.startswith(b"\xef") else 2
        assert serve_py == translate_py == f"error: <stdin>: line {line} is not valid UTF-8 ({reason})", data


def test_serve_py_refuses_what_translate_refuses_in_its_words():
    """Data that is not UTF-8 text, which translate.py names from its first bytes, and lines ended by
    \\r alone: serve.py translated UTF-16/32 text without a byte-order mark (valid UTF-8, NULs and
    all) and lines ended by \\r alone (as one line) into garbage, exit 0, and named gzip, xz or a
    byte-order mark's UTF-16 only as 'line 1 is not valid UTF-8'."""
    text = "A man is riding a bicycle.\nTwo dogs play in the snow.\n"
    for data, phrase in (
        (gzip.compress(text.encode()), "holds gzip compressed data"),
        (lzma.compress(text.encode()), "is xz compressed"),
        (text.encode("utf-16"), "is UTF-16 text (its byte-order mark says so)"),
        (text.encode("utf-32"), "is UTF-32 text (its byte-order mark says so)"),
        (text.encode("utf-16-le"), "looks like UTF-16LE text without a byte-order mark"),
        (text.encode("utf-32-be"), "looks like UTF-32BE text without a byte-order mark"),
        ("Привет мир\n".encode("utf-16-le"), "looks like UTF-16LE text without a byte-order mark"),
        (text.replace("\n", "\r").encode(), "hold 2 carriage returns (\\r), as lines ended by \\r alone"),
    ):
        serve_py, translate_py = _read_by_each(data)
        assert serve_py == translate_py, data
        assert isinstance(serve_py, str) and serve_py.startswith("error: <stdin>") and phrase in serve_py, serve_py


def test_serve_py_started_with_stdin_closed_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    """`python serve.py <&-` ended in an AttributeError traceback; now one line before the export is read."""
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets when started with fd 0 closed
    assert standalone.main([str(tmp_path / "no-export")]) == 2
    assert capsys.readouterr().err == "error: stdin is closed: serve.py translates the lines of stdin\n"


def test_serve_py_logs_in_the_commands_format(exported):
    """A long sentence's warning, as the jaxformer commands log it ("HH:MM:SS W ..."), on stderr;
    a line that is empty to the tokenizer (a byte-order mark alone) is an empty line."""
    result = run_serve_py(exported, input="\ufeff\n" + "A man rides a horse. " * 12 + "\nTwo dogs.\n")
    assert result.returncode == 0 and result.stdout.split("\n")[0] == "" and len(result.stdout.split("\n")) == 4
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d W sentence 2 \(line 2\) has \d+ tokens, more than max_source_tokens=32: translating it in "
        r"pieces\n",
        result.stderr,
    ), result.stderr
