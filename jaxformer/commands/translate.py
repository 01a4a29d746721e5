"""Translate text, one sentence per line: stdin to stdout, or file to file.

python translate.py --workdir runs/m30k < input.en > output.de
python translate.py --workdir runs/m30k --input input.en --output output.de --checkpoint best
"""

from __future__ import annotations

import argparse
import io
import sys

from jaxformer.commands import common
from jaxformer.commands.common import translator_from_flags  # a name of this module: tests replace it here


def read_lines(path: str | None) -> list[str]:
    """The lines of a UTF-8 file (gzip or plain), or of stdin when `path` is None."""
    from jaxformer.data import parallel_text

    if path is not None:
        return parallel_text.read_lines(path)
    return parallel_text.decode_lines(io.BytesIO(sys.stdin.buffer.read()), "<stdin>")


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__)
    common.add_decoding_flags(parser)
    parser.add_argument("--input", help="input file (default: stdin)")
    parser.add_argument("--output", help="output file (default: stdout)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar on stderr")
    return parser


def run(args: argparse.Namespace) -> int:
    common.check_workdir(args.workdir)
    common.check_readable_file(args.input, "--input")
    common.check_writable_file(args.output, "--output")
    sentences = read_lines(args.input)
    translator = translator_from_flags(args)
    translations = translator.translate(sentences, progress=not args.no_progress)
    text = "".join(" ".join(line.splitlines()) + "\n" for line in translations)  # one output line per input line
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        common.write_text_atomically(args.output, text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.run_command(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
