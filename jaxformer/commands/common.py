"""What every command shares: one argparse style, flag types that name what they allow,
logging routed around progress bars, and one way to report a user's error.

A command is `main(argv) -> exit code`, built by `run_command(parser, body, argv)`: a
`UserError` (bad config, flags, data, files, workdir) prints one line, `error: ...`, and exits
with `EXIT_USER_ERROR`; `--verbose` prints the traceback before that line and keeps the exit code.
A step's collective exchange whose other end went (a process of a multi-process run gone) is one
line too (failed_exit.lost_process). Anything else is a bug and keeps its traceback. Ctrl-C exits
with 130, as shells report it; a reader of stdout that went away (`| head`) ends the command
quietly with 141, as SIGPIPE would.
Every command keeps its compiled programs in the persistent compilation cache
(jaxformer/commands/compilation_cache.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import tqdm

from jaxformer.argument_parser import EXIT_CLOSED_PIPE, Parser, discard_output, path_text
from jaxformer.commands import failed_exit, launch
from jaxformer.commands.compilation_cache import enable_compilation_cache, repair_unreadable_entry
from jaxformer.decoding import sentence_batches
from jaxformer.errors import (
    EXIT_NO_SPACE,
    EXIT_USER_ERROR,
    UserError,
    exit_code_for_signal,
    file_size_limit_error,
    no_space_error,
)
from jaxformer.files import write_text_atomically, write_to_stream

logger = logging.getLogger(__name__)


class OutputError(UserError):
    """A command's output could not be written whole (other than a full disk or a closed pipe)."""


class FlagError(UserError):
    """A command-line flag has a value the command cannot use."""


CACHE_NOTE = (  # every command's --help ends with it (the formatter keeps these line breaks)
    "Compiled programs are kept for the next run in ~/.cache/jaxformer/xla\n"
    "($XDG_CACHE_HOME/jaxformer/xla; $JAX_COMPILATION_CACHE_DIR when set);\n"
    "JAXFORMER_COMPILATION_CACHE=0 turns that off."
)


def make_parser(doc: str | None) -> Parser:
    parser = Parser(description=doc, epilog=CACHE_NOTE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="show tracebacks and debug logging")
    return parser


# -- flag types: argparse turns their ArgumentTypeError into "argument --flag: <message>" ---------


def at_least(low: int) -> Callable[[str], int]:
    return _integer(f"integer >= {low}", lambda value: value >= low)


def integer_from(low: int, high: int) -> Callable[[str], int]:
    return _integer(f"integer from {low} to {high}", lambda value: low <= value <= high)


def _integer(kind: str, fits: Callable[[int], bool]) -> Callable[[str], int]:
    """A flag type taking an integer that `fits`, `kind` (e.g. "integer >= 1") naming what it takes."""

    def parse(text: str) -> int:
        return ruled_number(text, int, f"an {kind}", fits)

    parse.__name__ = kind
    return parse


def number(low: float, *, inclusive: bool) -> Callable[[str], float]:
    """A flag type taking a finite number above `low` (or from it, `inclusive`)."""
    bound = f">= {low}" if inclusive else f"> {low}"

    def parse(text: str) -> float:
        fits = (lambda value: value >= low) if inclusive else (lambda value: value > low)
        return ruled_number(text, float, f"a finite number {bound}", lambda value: fits(value) and value != math.inf)

    parse.__name__ = f"number {bound}"
    return parse


def ruled_number(text: str, kind: Callable[[str], Any], rule: str, allowed: Callable[[Any], bool]) -> Any:
    """A flag's number, `kind(text)` (int or float), refused unless `allowed` takes it, `rule`
    naming what it takes (e.g. beam_search.ALPHA_RULE) and the error the text given."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
    if not allowed(value):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value


# -- logging ---------------------------------------------------------------------------------


class TqdmHandler(logging.StreamHandler):
    """Writes log records through tqdm, so lines never glue onto a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001  (logging must never raise)
            self.handleError(record)


class _QuietLibraries(logging.Filter):
    """Drops orbax's and tfds's INFO chatter (a dozen lines per checkpoint) and jax's (its search
    for accelerators on a CPU machine); warnings pass, and errors too, but without the traceback
    of the library's own thread (orbax logs each of its writer threads' failures, dozens of lines
    apiece, and the error that ends the command is reported by it, once)."""

    # orbax's warnings about a step folder that jaxformer reads and reports on itself: one being
    # written or removed by a run training beside the reader, or damaged (the checkpoint's own
    # warning or error names it, with what is done about it).
    REPORTED_BY_JAXFORMER = ("Metadata file does not exist", "Failed to get item metadata from directory")

    def filter(self, record: logging.LogRecord) -> bool:
        noisy = any(library in record.pathname for library in ("/orbax/", "/tensorflow_datasets/", "/jax/"))
        if noisy and record.exc_info:
            record.exc_info, record.exc_text = None, None
        if noisy and "/orbax/" in record.pathname and record.levelno < logging.ERROR:
            message = record.getMessage()
            if any(text in message for text in self.REPORTED_BY_JAXFORMER):
                return False
        return record.levelno >= logging.WARNING or not noisy


def configure_logging(level: int, verbose: bool = False) -> logging.Handler:
    """The root logger's one handler (returned), through tqdm, at `level` (DEBUG and every
    library's records with `verbose`)."""
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(message)s", "%H:%M:%S"))
    if not verbose:
        handler.addFilter(_QuietLibraries())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else level)
    try:  # absl (used by orbax) logs through the standard logging tree once told so
        from absl import logging as absl_logging

        absl_logging.use_python_logging(quiet=True)
    except (ImportError, AttributeError):
        pass
    warnings.showwarning = _log_warning
    return handler


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Python's warnings as one log line each (through the handler above, so never across a
    progress bar), instead of two raw lines on stderr; jax's unreadable cache entry repaired."""
    text = str(message)
    repaired = repair_unreadable_entry(text)
    if repaired is None:
        text = f"{category.__name__}: {' '.join(text.split())} ({os.path.basename(filename)}:{lineno})"
    logging.getLogger("py.warnings").warning("%s", repaired or text)


# -- running a command -----------------------------------------------------------------------


def run_command(
    parser: argparse.ArgumentParser,
    body: Callable[[argparse.Namespace], int],
    argv: list[str] | None,
    log_level: int = logging.WARNING,
    compiles: Callable[[argparse.Namespace], bool] = lambda args: True,
) -> int:
    """Parses `argv`, runs `body(args)` and turns a user's error into one line and an exit code.
    `compiles(args)`: whether the command line compiles anything; one that only informs
    (`--list_configs`) does not depend on the compilation cache's settings."""
    args = parser.parse_args(argv)
    handler = configure_logging(log_level, args.verbose)
    try:
        launch.loaded()  # a Ctrl-C that came while the command loaded ends it here
        if compiles(args):
            enable_compilation_cache()  # before `body` compiles anything
        code = body(args)
        if sys.stdout is not None:  # what print() holds: a reader gone is a BrokenPipeError here, not at exit
            with writing_stdout():
                sys.stdout.flush()
        return code
    except UserError as error:
        if args.verbose:
            _print_traceback()
        message = str(error) or type(error).__name__
        sys.stderr.write(f"error: {message}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return exit_code_for_signal(signal.SIGINT)
    except BrokenPipeError:  # the reader of stdout closed it (`| head`): it wants no more, as SIGPIPE says
        _discard_stdout()
        return EXIT_CLOSED_PIPE
    except Exception as error:
        lost = failed_exit.lost_process(error)
        if lost is not None:
            if args.verbose:
                _print_traceback()
            sys.stderr.write(f"error: {lost}\n")
            return EXIT_USER_ERROR
        limit = _storage_limit(error)
        if limit is None:
            raise
        if args.verbose:
            _print_traceback()
        cause, remedy, code = limit
        where = f" writing {cause.filename}" if cause.filename else ""
        sys.stderr.write(
            f"error: {cause.strerror or cause}{where}: {remedy}, then run the same command again (a training run "
            "resumes from its last checkpoint)\n"
        )
        return code
    finally:
        # The command has ended, its last line written: what the libraries log from now on is their
        # exit callbacks' (jax's "Clearing JAX backend caches.", at DEBUG), which --verbose printed
        # after an `error:` line. Their warnings still pass.
        if args.verbose:
            handler.addFilter(_QuietLibraries())


# The storage limits a command's error line names: what finds each in an error's chain (the first
# found is named), what to change before running the same command again, the exit code. Rerunning
# under the same file-size limit changes nothing: a user's error.
_STORAGE_LIMITS = (
    (no_space_error, "free space (or quota)", EXIT_NO_SPACE),
    (file_size_limit_error, "a file-size limit (ulimit -f, or the file system's) stops it; raise it", EXIT_USER_ERROR),
)


def _storage_limit(error: BaseException) -> tuple[OSError, str, int] | None:
    """(the OSError, its remedy, the exit code) of the first of `_STORAGE_LIMITS` that `error` is or
    was raised from, else None."""
    for found_in, remedy, code in _STORAGE_LIMITS:
        cause = found_in(error)
        if cause is not None:
            return cause, remedy, code
    return None


def _print_traceback() -> None:
    """`--verbose`: the traceback of the error being handled goes to stderr before its one line;
    the exit code stays the one the error has without `--verbose` (a scheduler reads it)."""
    traceback.print_exc(file=sys.stderr)


def _discard_stdout() -> None:
    """Points stdout at /dev/null (`discard_output`), so that the interpreter's last flush of what it
    still holds does not fail a second time, with a message, after the command has ended."""
    if sys.stdout is not None:
        discard_output(sys.stdout)


def read_lines(path: str | None, what: str = "lines") -> list[str]:
    """The lines of a UTF-8 file (gzip or plain), or of stdin when `path` is None; on a terminal,
    which would wait without a word for a user who forgot --input, a line on stderr first says
    that it reads `what` (e.g. "sentences") there and how to end them."""
    from jaxformer.data import parallel_text

    if path is not None:
        return parallel_text.read_lines(path)
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise FlagError("stdin is closed: give --input, or run without closing it")
    if sys.stdin.isatty():
        logger.info("reading %s from the terminal, one per line; end with Ctrl-D (or give --input FILE)", what)
    return parallel_text.decode_lines(io.BytesIO(sys.stdin.buffer.read()), "<stdin>")


def add_input_output_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """--input and --output: text files, one item per line; stdin and stdout by default; an
    existing --output is replaced only with --overwrite."""
    parser.add_argument("--input", type=path_text, help=f"{what} file, one per line (default: stdin)")
    parser.add_argument(
        "--output", type=path_text, help="output file (default: stdout); an existing one needs --overwrite"
    )
    add_overwrite_flag(parser, "--output")


def add_overwrite_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true", help=f"replace an existing {what}")


def check_stdout_open(keeps_output: str = "--output") -> None:
    """Fails before any work when the command was started with stdout closed (`>&-`), where
    print() writes nowhere and says nothing; `keeps_output`: the flag that writes a file instead."""
    if sys.stdout is None:
        raise FlagError(f"stdout is closed: give {keeps_output}, or run without closing it")


def print_report(lines: list[str]) -> None:
    """A report on stdout in UTF-8 whatever its encoding, where print() fails on a path it cannot
    encode, after the work; nothing where stdout is closed (`>&-`), as print() writes nothing."""
    if sys.stdout is not None:
        write_lines(None, lines)


def write_lines(path: str | None, lines: list[str]) -> None:
    """One line per item (sentence_batches.as_lines, the rule serve.py writes by too), to `path`
    atomically, or to stdout when `path` is None."""
    text = sentence_batches.as_lines(lines)
    if path is not None:
        write_text_atomically(path, text)
        return
    check_stdout_open()
    with writing_stdout():
        write_to_stream(sys.stdout, text)


@contextlib.contextmanager
def writing_stdout() -> Iterator[None]:
    """A write to stdout that fails, named `<stdout>` in run_command's line: a full disk keeps its own
    line and exit code, another error (an I/O error, `ulimit -f`, a descriptor opened read-only) is an
    OutputError, one line, not a traceback; a reader gone ends the command as SIGPIPE would. What
    stdout still holds is dropped (`discard_output`): the interpreter's last flush of it failed
    again, after that line (`Exception ignored ... OSError`), and made the exit code 120."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        with contextlib.suppress(OSError, ValueError):  # a stand-in without a descriptor (a StringIO)
            discard_output(sys.stdout)
        if error.filename is None:  # a write names no file; the error ("No space left on device") should
            error.filename = "<stdout>"
        if no_space_error(error) is not None:
            raise
        raise OutputError(
            f"{error.strerror or error} writing {error.filename}: the lines written stop short of the end"
        ) from error
