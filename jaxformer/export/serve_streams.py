"""serve.py's standard streams: stdin read as translate.py reads it, a bad --batch_size or --seed, and
stdout given up once writing it failed. Standard library only: `jaxformer-export` copies this
module beside serve.py (jaxformer/export/standalone.py), which imports it."""

from __future__ import annotations

import argparse
import io
import os
import sys


class InputError(ValueError):
    """The text to translate cannot be read; the message names the line."""


def stdin_lines(data: bytes) -> list[str]:
    """The UTF-8 lines of `data` without their line breaks, and without a byte-order mark at its
    start, as translate.py reads stdin (jaxformer/data/parallel_text.py's `decode_lines` of the
    same lines, which serve.py cannot import; its refusal of lines ended by \\r alone is a file
    rule, not a stream's); a line that is not UTF-8 is an InputError naming it, with that reader's
    message: each line is decoded with its line break, as there (a character cut short by it is
    an invalid continuation byte, not the end of the data)."""
    lines = []
    for number, raw in enumerate(io.BytesIO(data), start=1):
        try:
            lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as error:
            raise InputError(
                f"<stdin>: line {number} is not valid UTF-8 ({error.reason} at byte {error.start})"
            ) from None
    return lines


def positive_integer(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def seed_number(text: str) -> int:
    """--seed: digits (its upper bound, a key's, is export_files.first_key's to check)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return int(text)


def discard_stdout() -> None:
    """Points stdout at /dev/null once writing it failed, so that the interpreter's last flush of
    what it still holds does not fail again, with a message, after serve.py has said why."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
