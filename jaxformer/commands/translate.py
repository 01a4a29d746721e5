"""Translate text, one sentence per line: stdin to stdout, or file to file (`jaxformer-translate`;
`python translate.py` in a clone).

    jaxformer-translate --workdir runs/m30k < input.en > output.de
    jaxformer-translate --workdir runs/m30k --input input.en --output output.de --checkpoint best
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.translate")

import argparse
import logging

from jaxformer.commands import common, decoding_flags
from jaxformer.commands.decoding_flags import translator_from_flags  # a name of this module: tests replace it here


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__)
    decoding_flags.add_decoding_flags(parser)
    common.add_input_output_flags(parser, "input")
    return parser


def run(args: argparse.Namespace) -> int:
    sentences = decoding_flags.checked_input_lines(args, "sentences")
    translator = translator_from_flags(args)
    common.write_lines(args.output, translator.translate(sentences, progress=not args.no_progress))
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.run_command(build_parser(), run, argv, log_level=logging.INFO)
