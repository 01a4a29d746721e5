"""Where every command starts: the console scripts (pyproject.toml), a clone's script for each
(train.py, translate.py, ..., sweep.py), and `python -m jaxformer.commands.NAME`
(each command module calls `run_as_main` first when it is `__main__`) call the functions below.

Loading a command (importing it and building its parser) takes a second or more: jax, flax,
orbax, tfds. A Ctrl-C then printed the traceback of whatever module was loading, or of the error
it left in a native module's import, or was printed as "Exception ignored" by the garbage
collector's callback that jax registers, and lost. While `launch` loads a command, a Ctrl-C is
kept instead: run_command, once it has the command line, ends the command as it ends one that
comes later (`interrupted`, exit 130). A second Ctrl-C while loading interrupts at once.
Once the command has returned its exit code (or, for a training run, once the run's work is done,
before its summary), a SIGTERM or Ctrl-C, while Python exits too (jax's clean-up takes half a
second), changes nothing: the command's work is done (an export in place, a run complete or
stopped and saved) and its exit code says so. Until the exit callbacks end it is said in one
line, and a second one ends the process at once; after them it is ignored.
A process of a multi-process run whose command failed (an exit code from 1 to 127, or an error
that escaped it) waits for the others at jax's shutdown for seconds only (failed_exit.py).
This module imports the standard library, jaxformer.errors and failed_exit alone, so that it is loaded at once.
Before it loads a command it checks the jax variables of the compilation cache that the README
names: jax reads them as it is imported, and a bad value was a 38-line traceback from that import.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import NoReturn

from jaxformer.commands import failed_exit
from jaxformer.errors import EXIT_USER_ERROR, UserError, exit_code_for_signal

_kept: list[int] = []  # the Ctrl-C that came while the command was loading


def _keep(signum: int, frame) -> None:
    if _kept:  # a second one: at once
        raise KeyboardInterrupt
    _kept.append(signum)


# jax's own parsing of these (jax/_src/config.py: bool_env, and int() / float() for its flags).
_JAX_TRUTH_VALUES = ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0")
_JAX_NUMBERS = {
    "JAX_COMPILATION_CACHE_MAX_SIZE": (int, "a whole number of bytes (-1: no bound)"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": (float, "a number of seconds"),
}


def jax_variable_error(environ: Mapping[str, str]) -> str | None:
    """The one line that says what is wrong with a compilation-cache variable jax would refuse
    as it is imported (None: nothing)."""
    switch = environ.get("JAX_ENABLE_COMPILATION_CACHE")
    if switch is not None and switch.lower() not in _JAX_TRUTH_VALUES:
        return (
            f"environment variable JAX_ENABLE_COMPILATION_CACHE={switch!r}: jax reads true, yes, on or 1 "
            "(the cache on), false, no, off or 0 (off); unset it to keep the cache on"
        )
    for name, (kind, expected) in _JAX_NUMBERS.items():
        value = environ.get(name)
        if value is None:
            continue
        try:
            kind(value)
        except ValueError:
            return f"environment variable {name}={value!r} is not {expected}, which jax needs; fix or unset it"
    return None


def launch(module: str, argv: list[str] | None = None) -> int:
    """`module`'s `main(argv)`, a Ctrl-C kept while it loads (see `loaded`), and one that comes
    before run_command handles it ended as run_command does. A compilation-cache variable jax
    would refuse on import is an error in one line first (exit 2), and so is a UserError raised
    while the command is imported (sentencepiece's model proto with too old a protobuf)."""
    problem = jax_variable_error(os.environ)
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        return EXIT_USER_ERROR
    keeping = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not ignored (a background job)
    )
    if keeping:
        signal.signal(signal.SIGINT, _keep)
    _launching.append(module)
    try:
        try:
            command = importlib.import_module(module)
        except UserError as error:  # packages installed at versions that cannot work together
            sys.stderr.write(f"error: {error}\n")
            return EXIT_USER_ERROR
        code = command.main(argv)
    except KeyboardInterrupt:
        pass
    except SystemExit:  # argparse's --help, or its usage error, before run_command
        if not _kept:
            raise
    except Exception:  # a bug: its traceback, exit 1
        failed_exit.end_within_bound(1)
        raise
    else:
        failed_exit.end_within_bound(code)
        keep_exit_code(code)
        return code
    finally:
        _launching.pop()
        if signal.getsignal(signal.SIGINT) is _keep:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    _kept.clear()
    sys.stderr.write("interrupted\n")
    return exit_code_for_signal(signal.SIGINT)


_finished: list[int] = []  # the exit code of the command that returned
_launching: list[str] = []  # the command `launch` runs: its process ends when it returns


def keep_exit_code(code: int) -> None:
    """SIGTERM and SIGINT, from now until the process ends, leave `code` as its exit code: one that
    comes before the exit callbacks end (jax's) is said in one line, and a second one ends the
    process at once; after those callbacks Python handles no signal, and they are ignored. A
    command whose work is done before it returns calls it then (train, before its run's summary);
    `launch` calls it as the command returns: a second call sets the code, not the handlers again.
    A command called from Python (train.main in a notebook) is not launched: its caller's handlers
    stay, and a Ctrl-C after it interrupts the caller as before."""
    if threading.current_thread() is not threading.main_thread() or not _launching:
        return
    kept, _finished[:] = bool(_finished), [code]
    if kept:  # a signal since may have made the next one end the process: it stays so
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) != signal.SIG_IGN:  # an ignored one (a background job's Ctrl-C) stays so
            signal.signal(signum, _after_the_end)


def _after_the_end(signum: int, frame) -> None:
    for each in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(each) is _after_the_end:
            signal.signal(each, signal.SIG_DFL)  # a second one: at once
    with contextlib.suppress(OSError, ValueError):  # stderr closed, or its reader gone
        sys.stderr.write(
            f"{signal.Signals(signum).name} came once the command's work was done; exiting with {_finished[0]}\n"
        )
        sys.stderr.flush()


@atexit.register  # when this module is imported, before jax is: its exit callbacks run after jax's
def _ignore_signals_once_python_ends() -> None:
    """Python then resets the handlers it set to the default (death, 128 + the signal's number)
    and frees its modules (jax's, for a fraction of a second); an ignored signal stays ignored."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) is _after_the_end:
            signal.signal(signum, signal.SIG_IGN)


def loaded() -> None:
    """The command is loaded (run_command calls this first): Python's Ctrl-C again, and a
    KeyboardInterrupt now for one that came while it loaded."""
    if signal.getsignal(signal.SIGINT) is _keep:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _kept:
        _kept.clear()
        raise KeyboardInterrupt


def run_as_main(module: str) -> NoReturn:
    """`python -m jaxformer.commands.NAME`, or its file run as a script: `module` launched as its
    console script is. Run as `__main__`, a command module calls this before its own imports:
    run as they come, they would load jax with Python's Ctrl-C (a traceback) in place. Its usage
    line names the command as it was run (argparse would take the file's name, `translate.py`)."""
    sys.argv[0] = f"python -m {module}"
    sys.exit(launch(module))


def run_as_script(main: Callable[[list[str] | None], int]) -> NoReturn:
    """A clone's script for a command (train.py, translate.py, ..., sweep.py), run:
    `main` (this module's) launched, its usage line and errors naming the command as it was run,
    `python train.py` (argparse would take the file's name, `train.py`, which a shell does not run)."""
    sys.argv[0] = f"python {os.path.basename(sys.argv[0])}"
    sys.exit(main())


def _command(name: str) -> Callable[[list[str] | None], int]:
    def main(argv: list[str] | None = None) -> int:
        return launch(f"jaxformer.commands.{name}", argv)

    main.__name__ = main.__qualname__ = name
    main.__doc__ = f"jaxformer.commands.{name}.main, launched (a Ctrl-C while it loads: exit 130)."
    return main


train = _command("train")
translate = _command("translate")
evaluate = _command("evaluate")
average_checkpoints = _command("average_checkpoints")
export = _command("export")
generate = _command("generate")
convert = _command("convert")
sweep = _command("sweep")
