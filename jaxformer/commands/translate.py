"""Translate text, one sentence per line: stdin to stdout, or file to file.

    python translate.py --workdir runs/m30k < input.en > output.de
    python translate.py --workdir runs/m30k --input input.en --output output.de --checkpoint best
"""

from __future__ import annotations

import argparse
import io
import pathlib
import sys

from jaxformer.commands.common import add_decoding_flags, translator_from_flags
from jaxformer.data import parallel_text


def read_lines(path: str | None) -> list[str]:
    """The lines of a UTF-8 file (gzip or plain), or of stdin when `path` is None."""
    if path is not None:
        return parallel_text.read_lines(path)
    return parallel_text.decode_lines(io.BytesIO(sys.stdin.buffer.read()), "<stdin>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_flags(parser)
    parser.add_argument("--input", help="input file (default: stdin)")
    parser.add_argument("--output", help="output file (default: stdout)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar on stderr")
    args = parser.parse_args(argv)
    sentences = read_lines(args.input)
    translator = translator_from_flags(args)
    translations = translator.translate(sentences, progress=not args.no_progress)
    text = "".join(" ".join(line.splitlines()) + "\n" for line in translations)  # one output line per input line
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output = pathlib.Path(args.output)
        temporary = output.with_name(output.name + ".tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(output)  # no half-written output file
    return 0


if __name__ == "__main__":
    sys.exit(main())
