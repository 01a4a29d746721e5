"""The commands alike: a clone's script for each console script, written alike; one rule for the
decoding commands' --batch_size defaults, which their --help gives; --help into a closed pipe ends
quietly with 141, as every command's other output does, and into a full disk (or another failed
write) with one `error:` line naming stdout and the exit code of the commands' output that fails so;
and with --verbose the `error:` line stays the last line on stderr, after jax's exit callbacks too."""

import ast
import errno
import importlib
import inspect
import io
import logging
import os
import pathlib
import sys
import tomllib

import pytest

from jaxformer.commands import common, decoding_flags, train
from jaxformer.errors import EXIT_NO_SPACE, EXIT_USER_ERROR, UserError

ROOT = pathlib.Path(__file__).parents[2]
COMMANDS = sorted(
    target.partition(":")[2]
    for target in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].values()
)


def test_every_console_script_has_a_clones_script_written_alike():
    """train.py, translate.py, evaluate.py and average_checkpoints.py were the only scripts at the
    top of a clone: export, generate, convert and sweep had none."""
    assert len(COMMANDS) == 8
    for name in COMMANDS:
        script = ROOT / f"{name}.py"
        assert script.is_file(), f"no {script.name} for jaxformer-{name.replace('_', '-')}"
        body = ast.parse(script.read_text()).body
        assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # its docstring
        assert sorted(ast.unparse(node) for node in body[1:]) == sorted(
            [
                f"from jaxformer.commands.launch import {name} as main",
                "from jaxformer.commands.launch import run_as_script",
                "if __name__ == '__main__':\n    run_as_script(main)",
            ]
        ), script.name


def test_the_batch_size_defaults_decode_one_number_of_rows_at_once_and_their_help_says_so():
    """translate and evaluate decode two batches of 32 at once, generate and an export's loader one of
    64: --help said `(default: 32)` and `(default: 64)`, not why they differ."""
    rows = 64
    for name, default, how in (
        ("translate", 32, "two batches decode at once, from two threads"),
        ("evaluate", 32, "two batches decode at once, from two threads"),
        ("generate", 64, "one batch decodes at a time"),
        ("export", 64, "one batch decodes at a time"),
    ):
        parser = importlib.import_module(f"jaxformer.commands.{name}").build_parser()
        (flag,) = [action for action in parser._actions if "--batch_size" in action.option_strings]
        assert flag.default == default, name
        assert how in flag.help and f"(default: {default}, so that {rows} rows decode at once" in flag.help, name
    # The rule the commands' defaults follow is the Python entry points' too.
    from jaxformer.decoding.language_model import LanguageModel
    from jaxformer.decoding.translator import Translator
    from jaxformer.export.exporter import ServingSettings

    translator = inspect.signature(Translator).parameters
    assert translator["parallel_batches"].default == decoding_flags.TRANSLATOR_BATCHES_AT_ONCE
    assert translator["batch_size"].default * translator["parallel_batches"].default == rows
    assert inspect.signature(LanguageModel).parameters["batch_size"].default == rows
    assert ServingSettings().batch_size == rows == decoding_flags.DECODING_ROWS


@pytest.mark.parametrize("name", COMMANDS)
def test_help_into_a_closed_pipe_ends_quietly_with_141(name, monkeypatch, capfd):
    """`jaxformer-NAME --help | true`: argparse ignored the failed write, and Python's last flush
    of stdout then printed `Exception ignored ... BrokenPipeError` and exited 120, where the
    commands' other output (`--list_configs | true`, translate's `| head -1`) exits 141 quietly."""
    parser = importlib.import_module(f"jaxformer.commands.{name}").build_parser()
    reader, writer = os.pipe()
    os.close(reader)
    stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(writer, "w")), encoding="utf-8")  # a pipe's: buffered
    monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["--help"])
    assert ended.value.code == 141
    stdout.close()  # the interpreter's last flush: nothing is left to fail
    assert capfd.readouterr().err == ""


FULL_DISK = (
    f"error: {os.strerror(errno.ENOSPC)} writing <stdout>: free space (or quota), then run the same command again"
)


def _full_stdout(monkeypatch) -> io.TextIOWrapper:
    """sys.stdout redirected to /dev/full (`> /dev/full`): every write that reaches it fails with ENOSPC."""
    stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO("/dev/full", "w")), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", stdout)
    return stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_help_into_a_full_disk_is_one_line_and_exits_75(name, monkeypatch, capfd):
    """`jaxformer-NAME --help > /dev/full`: argparse ignored the failed write (and, before print_help
    flushed it, Python's last flush printed `Exception ignored ... OSError: [Errno 28]` and exited
    120), where the commands' output into a full disk is one line and exit 75."""
    parser = importlib.import_module(f"jaxformer.commands.{name}").build_parser()
    stdout = _full_stdout(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args(["--help"])
    assert ended.value.code == EXIT_NO_SPACE
    stdout.close()  # the interpreter's last flush: nothing is left to fail
    assert capfd.readouterr().err == FULL_DISK + "\n"


class _FailingFile(io.RawIOBase):
    """A file at `path` whose writes fail with `error_number` (an I/O error, `ulimit -f`) until its
    descriptor is pointed at /dev/null."""

    def __init__(self, path, error_number: int):
        self.error_number, self.descriptor = error_number, os.open(path, os.O_WRONLY | os.O_CREAT)

    def writable(self):
        return True

    def write(self, data):
        if os.path.samestat(os.fstat(self.descriptor), os.stat(os.devnull)):
            return len(data)
        raise OSError(self.error_number, os.strerror(self.error_number))

    def fileno(self):
        return self.descriptor

    def close(self):
        os.close(self.descriptor)
        super().close()


@pytest.mark.parametrize("error_number", [errno.EIO, errno.EFBIG])
def test_help_into_a_failing_stdout_is_one_line_and_exits_2(error_number, tmp_path, monkeypatch, capfd):
    """As translate's lines into such a stdout (`OutputError`): exit 2, the OS's reason in one line."""
    stdout = io.TextIOWrapper(io.BufferedWriter(_FailingFile(tmp_path / "stdout", error_number)), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(SystemExit) as ended:
        train.build_parser().parse_args(["--help"])
    assert ended.value.code == EXIT_USER_ERROR
    stdout.close()
    assert capfd.readouterr().err == (
        f"error: {os.strerror(error_number)} writing <stdout>: the help written stops short of the end\n"
    )


@pytest.mark.parametrize("argv", [["--list_configs"], ["--config", "tiny", "--print_config"]])
def test_a_list_into_a_full_disk_names_stdout(argv, monkeypatch, capfd):
    """train's --list_configs and --print_config exited 75 with `error: No space left on device: free
    space ...`, naming nothing written."""
    stdout = _full_stdout(monkeypatch)
    assert train.main(argv) == EXIT_NO_SPACE
    stdout.close()
    assert capfd.readouterr().err.splitlines() == [f"{FULL_DISK} (a training run resumes from its last checkpoint)"]


def test_verbose_leaves_the_error_line_last_after_jaxs_exit_callbacks(capsys):
    """jax's exit callback logs `Clearing JAX backend caches.` at DEBUG
    (jax/_src/xla_bridge.py: _clear_backends), which --verbose printed after the `error:` line."""

    def user_error(args):
        raise UserError("mesh.shape=(2, 1, 1) has 2 devices but 1 are available")

    assert common.run_command(common.make_parser(None), user_error, ["--verbose"]) == EXIT_USER_ERROR
    at_exit = logging.LogRecord(
        "jax._src.xla_bridge",
        logging.DEBUG,
        "/venv/site-packages/jax/_src/xla_bridge.py",
        905,
        "Clearing JAX backend caches.",
        None,
        None,
    )
    logging.getLogger(at_exit.name).handle(at_exit)
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith(
        "error: mesh.shape=(2, 1, 1) has 2 devices but 1 are available\n"
    ), err[-300:]
