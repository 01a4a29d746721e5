"""The command-line parser of every jaxformer command and of an export's serve.py: argparse with
one-line errors, a flag that holds one value refused when given twice, and the type of every
argument that names a local path.

It imports the standard library alone, because `jaxformer-export` copies it beside serve.py,
which runs where jaxformer is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import sys

if __package__:  # jaxformer.argument_parser
    from jaxformer.files import home_expanded
else:  # an export's copy, beside serve.py, without jaxformer.files: its rule (a test holds the two alike)
    home_expanded = os.path.expanduser

EXIT_USAGE = 2  # argparse's status for a bad command line; jaxformer.errors.EXIT_USER_ERROR is the same
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE  # as a shell reports a process SIGPIPE ended (Python ignores SIGPIPE)
# sysexits.h's EX_TEMPFAIL: the disk (or quota) is full; free space and run again. Here, for the
# --help of every command and of an export's serve.py, and serve.py's translations written to
# stdout (serve_streams.py, which an export gives this file's copy); jaxformer.errors takes it from here.
EXIT_NO_SPACE = 75


class _StoreOnce(argparse._StoreAction):
    """argparse's plain `store`, refusing a second value: argparse would keep the last one and
    drop the first without a word, so `--config tiny ... --config multi30k` would train multi30k."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = parser.__dict__.setdefault("_values_given", {})
        if option_string is not None:  # a positional argument cannot be given twice
            if self in given:
                raise argparse.ArgumentError(self, f"given twice ({given[self]!r}, then {values!r})")
            given[self] = values
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (`error: argument --batch_size: ...; see PROG --help`, where
    argparse prints its usage first), and a flag that holds one value refused when given twice."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        self._values_given = {}  # each parse starts afresh: a parser may parse several command lines
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        sys.stderr.write(f"error: {message}; see {self.prog} --help\n")
        sys.exit(EXIT_USAGE)

    def print_help(self, file=None):
        """argparse's, flushed at once, so that a reader gone (`--help | head -1`) ends the command
        quietly with 141, as its other output does (jaxformer.commands.common.run_command): argparse
        ignored the failed write, and Python's last flush of stdout then printed `Exception ignored
        ... BrokenPipeError` and exited 120. Another failed write (a full disk, an I/O error) is one
        `error:` line, as a command's output that fails so (`_help_not_written`)."""
        file = file or sys.stdout or sys.stderr  # stdout closed (`>&-`): argparse writes to stderr
        try:
            file.write(self.format_help())
            file.flush()
        except BrokenPipeError:
            discard_output(file)
            sys.exit(EXIT_CLOSED_PIPE)
        except OSError as error:
            discard_output(file)
            sys.exit(_help_not_written(error, file))


def _help_not_written(error: OSError, file) -> int:
    """The exit code of a --help that `file` failed to take with `error`, said on stderr in one line
    first, as a command's output that fails so: EXIT_NO_SPACE for a full disk (or quota), else
    EXIT_USAGE (2, as jaxformer.errors.EXIT_USER_ERROR: an I/O error, a file-size limit)."""
    where = "<stdout>" if file is sys.stdout else "<stderr>" if file is sys.stderr else getattr(file, "name", file)
    line = f"error: {error.strerror or error} writing {where}: "
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        line, code = line + "free space (or quota), then run the same command again", EXIT_NO_SPACE
    else:
        line, code = line + "the help written stops short of the end", EXIT_USAGE
    with contextlib.suppress(OSError, AttributeError):  # stderr full too, or closed: the exit code says it
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return code


def discard_output(stream) -> None:
    """Points `stream`'s descriptor at /dev/null once writing it failed (its reader gone, a full disk),
    so that the interpreter's last flush of what it still holds does not fail a second time, with a
    message, after the command has ended. What it holds goes out first where it still can: the pipe
    that broke may have been a FIFO --output's, not the stream's."""
    with contextlib.suppress(OSError):
        stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def path_text(text: str) -> str:
    """A local file or folder path: not empty, which would mean the current directory by accident,
    and not a URL (gs://, s3://), which local file operations would take for a folder named gs:.
    A leading "~" or "~user" is that home folder (`home_expanded`), in `--workdir=~/runs` too,
    which the shell passes as written; one naming no user is refused, not made a folder "~name"."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a path, got {'an empty one' if not text else repr(text)}")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise argparse.ArgumentTypeError(
            f"must be a local path or a mounted file system (NFS, gcsfuse), not a URL: {text!r}"
        )
    path = home_expanded(text)
    if path.startswith("~"):
        home = path.split("/", 1)[0]
        raise argparse.ArgumentTypeError(
            f"{text!r} starts with {home}, but there is no user {home[1:]!r} whose home folder that is; "
            f"for a folder named {home} here, give ./{text}"
        )
    return path


path_text.__name__ = "path"
