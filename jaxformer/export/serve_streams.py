"""serve.py's standard streams: stdin read as translate.py reads it (text_lines.py), a bad
--batch_size or --seed, and the translations written to stdout, given up once writing it failed.
Standard library only: `jaxformer-export` copies this module beside serve.py
(jaxformer/export/standalone.py), which imports it, and gives it its copies of text_lines.py and
argument_parser.py (the exit codes and the stream given up, as every command's)."""

from __future__ import annotations

import argparse
import errno
import io
import sys

if __package__:  # jaxformer.export.serve_streams; an export's copy is given these by serve.py (`_import_beside`)
    from jaxformer import argument_parser
    from jaxformer.data import text_lines


class InputError(ValueError):
    """The text to translate cannot be read; the message names the line."""


def stdin_lines(data: bytes) -> list[str]:
    """The UTF-8 lines of `data` without their line breaks, as translate.py reads stdin: with
    text_lines.decode_lines, which an export holds a copy of (gzip or UTF-16 data, lines ended by \\r
    alone and the first line that is not UTF-8 named, a byte-order mark dropped); an InputError with
    its message where it refuses them."""
    try:
        return text_lines.decode_lines(io.BytesIO(data), "<stdin>")
    except text_lines.TextError as error:
        raise InputError(str(error)) from None


def positive_integer(text: str) -> int:
    """--batch_size: ASCII digits (int() refuses some digits str.isdigit() takes: '²')."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def seed_number(text: str) -> int:
    """--seed: digits (its upper bound, a key's, is export_program.first_key's to check)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return int(text)


def write_stdout(text: str) -> int:
    """serve.py's exit code after writing `text` to stdout: 0, or, as translate.py, EXIT_CLOSED_PIPE
    (128 + SIGPIPE) once the reader has gone and EXIT_NO_SPACE for a full disk, with the OS's reason
    in one line on stderr for any write error; what was written is kept. Stdout is then pointed at
    /dev/null (`argument_parser.discard_output`), so that the interpreter's last flush does not fail
    again, with a message, after serve.py has said why."""
    try:
        # Through the byte buffer, checking what it wrote: a text stream's write drops the short
        # count a buffered writer returns once the pipe's reader has gone (CPython 3.11).
        if not hasattr(sys.stdout, "buffer"):  # a StringIO in its place (a caller capturing the output)
            sys.stdout.write(text)
            return 0
        output = memoryview(text.encode("utf-8"))
        while output:
            output = output[sys.stdout.buffer.write(output) :]
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the reader closed stdout (`| head`): no more is wanted, as SIGPIPE says
        argument_parser.discard_output(sys.stdout)
        return argument_parser.EXIT_CLOSED_PIPE
    except OSError as error:  # a full disk, EIO, EFBIG (`ulimit -f`), ...: one line, not a traceback
        argument_parser.discard_output(sys.stdout)
        where = f"{error.strerror or error} writing <stdout>"
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            sys.stderr.write(f"error: {where}: free space (or quota), then run the same command again\n")
            return argument_parser.EXIT_NO_SPACE
        sys.stderr.write(f"error: {where}: the translations written stop short of the end\n")
        return 2
    return 0
