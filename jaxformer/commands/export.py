"""Export a checkpoint for serving: one directory with the parameters (safetensors), the
tokenizer, the search (beam search, greedy search or sampling: --method) as a serialized jax.export
program and serve.py, a loader that needs only jax, numpy, sentencepiece and flatbuffers (which jax
reads the program with).

jaxformer-export --workdir runs/m30k --checkpoint best --output exports/m30k
python exports/m30k/serve.py < sentences.en > sentences.de
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.export")

import argparse
import functools
import logging
import signal
import sys

from jaxformer.commands import common
from jaxformer.commands.common import integer_from, make_parser, run_command
from jaxformer.commands.decoding_flags import (
    add_batch_size_flag,
    add_beam_flags,
    add_checkpoint_flags,
    add_renormalize_flag,
    add_sampling_flags,
    check_search_flags,
    decode_settings_from_flags,
)
from jaxformer.commands.path_checks import check_workdir
from jaxformer.decoding.generate import METHODS
from jaxformer.decoding.sentence_batches import MAX_SOURCE_TOKENS
from jaxformer.errors import exit_code_for_signal
from jaxformer.export.program import KNOWN_PLATFORMS, PLATFORMS
from jaxformer.run.directory import checkpoint_name
from jaxformer.training.signals import RaiseOnSignal, Stopped


def platform_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in KNOWN_PLATFORMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of {', '.join(KNOWN_PLATFORMS)}; got {text!r}"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"names {', '.join(repeated)} more than once; got {text!r}")
    return names


platform_list.__name__ = "platform list"


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    add_checkpoint_flags(parser)
    parser.add_argument(
        "--output", required=True, type=common.path_text, help="the export directory to write (absent or empty)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the export already in --output")
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="beam",
        help="the search the program runs (default: beam, whatever search the run's final choice was made with)",
    )
    add_beam_flags(parser)
    add_renormalize_flag(parser)
    add_sampling_flags(parser, "serve.py's default (its --seed overrides it)")
    add_batch_size_flag(
        parser, "the loader's sentences", note=" (config.json keeps it; serve.py's --batch_size overrides it)"
    )
    parser.add_argument(
        "--max_source_tokens",
        type=integer_from(2, MAX_SOURCE_TOKENS),
        default=None,
        help=f"the longest source the program takes, at most {MAX_SOURCE_TOKENS} and the model's positions; "
        "longer inputs are translated in pieces (default: 256, or the model's positions where fewer)",
    )
    parser.add_argument(
        "--platforms",
        type=platform_list,
        default=PLATFORMS,
        help=f"platforms to lower the program for, comma-separated (default: {','.join(PLATFORMS)})",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from jaxformer.export.exporter import ServingSettings, export_checkpoint

    check_search_flags(args)  # a flag of another search than --method's, before anything is read
    check_workdir(args.workdir)
    serving = ServingSettings(batch_size=args.batch_size, max_source_tokens=args.max_source_tokens)
    # The default handlers would end the process at once, leaving the staging directory behind;
    # Stopped unwinds through the exporter, which removes it. Once the export is in place the
    # work is done: a signal then ends nothing early, and the command says so and exits with 0.
    try:
        with RaiseOnSignal() as signals:
            summary = export_checkpoint(
                args.workdir,
                args.output,
                args.checkpoint,
                serving=serving,
                platforms=args.platforms,
                overwrite=args.overwrite,
                on_placed=signals.finish,
                seed=args.seed,
                # final/'s search settled from the one read of the checkpoint: beam search takes its
                # settings and alpha, greedy search and sampling its max_extra_length, as translate's do.
                settle_search=functools.partial(decode_settings_from_flags, args, None),
            )
            for platform, reason in summary.failed.items():
                print(f"not exported for {platform}: {reason}", file=sys.stderr)
            print(
                f"exported step {summary.step} of {args.workdir} ({checkpoint_name(args.checkpoint)}) to "
                f"{summary.directory} for {', '.join(summary.platforms)}"
            )
    except Stopped as stop:  # a BaseException: no `except Exception` on the way took it for an error
        sys.stderr.write(
            f"error: {args.output}: stopped by {signal.Signals(stop.signum).name}; an export is put in place "
            f"whole or not at all; exiting with {exit_code_for_signal(stop.signum)}\n"
        )
        return exit_code_for_signal(stop.signum)
    if signals.late_signum is not None:
        sys.stderr.write(
            f"{signal.Signals(signals.late_signum).name} came once the export was in place: it is complete; "
            "exiting with 0\n"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), run, argv, log_level=logging.INFO)
