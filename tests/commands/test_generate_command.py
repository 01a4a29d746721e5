"""generate, run as a user runs it, as translate is (test_translate_command.py): its progress bar
and --no_progress, and stdin read from a pipe or a terminal. A random tiny decoder-only model
(conftest's language_model_workdir) stands in for a trained one: what is checked is the command's,
not the continuations' quality."""

import io
import sys

import pytest

from jaxformer.commands import generate, translate
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.language_model import LanguageModel
from tests.commands.test_translate_command import TERMINAL_HINT, run_on_a_terminal

pytestmark = pytest.mark.xdist_group("language-model-workdir")
NEW_TOKENS = 3
PROMPTS = ["Ein Mann", "Zwei Hunde spielen", "Ein Kind"]


def continued(workdir, prompts):
    settings = DecodeSettings(method="greedy", max_extra_length=NEW_TOKENS)
    return LanguageModel.from_workdir(workdir, settings=settings).complete(prompts)


def typed_in(monkeypatch, text):
    """`text` as the command's stdin, a pipe's (no terminal)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_generate_draws_the_bar_translate_draws_unless_told_not_to(language_model_workdir, capsys, monkeypatch):
    """generate drew no bar and took no --no_progress, unlike translate and evaluate: now the same
    flag (its help as translate's), the same bar on stderr, on a terminal only."""
    flags = ["--workdir", str(language_model_workdir), "--max_new_tokens", str(NEW_TOKENS)]
    expected = "".join(line + "\n" for line in continued(language_model_workdir, PROMPTS))
    help_lines = {}
    for command in (generate, translate):
        help_lines[command] = [line.split() for line in command.build_parser().format_help().splitlines()]
    no_progress = [[line for line in lines if line[:1] == ["--no_progress"]] for lines in help_lines.values()]
    assert no_progress[0] == no_progress[1] == [["--no_progress", "no", "progress", "bar", "on", "stderr"]]

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the progress bar is drawn on a terminal only
    typed_in(monkeypatch, "\n".join(PROMPTS) + "\n")
    assert generate.main(flags) == 0
    out, err = capsys.readouterr()
    assert out == expected and "generate: 100%" in err and "3/3" in err  # stdout: the continuations alone
    assert TERMINAL_HINT not in err  # stdin was a pipe: read without a word

    typed_in(monkeypatch, "\n".join(PROMPTS) + "\n")
    assert generate.main([*flags, "--no_progress"]) == 0
    out, err = capsys.readouterr()
    assert out == expected and "generate:" not in err

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)  # ... nor where stderr is a file or a pipe
    typed_in(monkeypatch, "\n".join(PROMPTS) + "\n")
    assert generate.main(flags) == 0
    out, err = capsys.readouterr()
    assert out == expected and "generate:" not in err


# slow: a second command on a terminal (about 8 s, a process on a pseudo-terminal); covered in the default suite
# by tests/commands/test_translate_command.py's test_translate_says_it_reads_the_terminal_before_it_waits_there
# (the same hint: both commands read stdin with jaxformer/commands/common.py's read_lines).
@pytest.mark.slow
def test_generate_says_it_reads_the_terminal_before_it_waits_there(language_model_workdir):
    """As translate (test_translate_command.py): one log line on stderr says what it waits for."""
    flags = ["--workdir", str(language_model_workdir), "--max_new_tokens", str(NEW_TOKENS)]
    code, out, err, asked_first = run_on_a_terminal(["generate", *flags], "Ein Mann\n")
    assert asked_first, err[-3000:]
    assert code == 0, err[-3000:]
    hint = [line for line in err.splitlines() if TERMINAL_HINT in line]
    assert len(hint) == 1 and hint[0].endswith(f" I reading prompts {TERMINAL_HINT}")
    assert out == continued(language_model_workdir, ["Ein Mann"])[0] + "\n"
