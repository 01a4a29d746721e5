"""Average the parameters of the last N checkpoints of a run into `workdir/averaged/<step>`
(`jaxformer-average-checkpoints`; `python average_checkpoints.py` in a clone). The checkpoints
must be one run's (its model, tokenizers, data and run-defining config): a step of another run is
refused, naming the first difference, before any parameters are read.

    jaxformer-average-checkpoints --workdir runs/m30k --last 5
    jaxformer-evaluate --workdir runs/m30k --checkpoint averaged --split test_2016_flickr
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.average_checkpoints")

import argparse
import logging
import signal
import sys

from jaxformer.commands.common import at_least, make_parser, path_text, print_report, run_command
from jaxformer.commands.path_checks import check_workdir
from jaxformer.run.averaging import average_last
from jaxformer.run.directory import RunDirectory
from jaxformer.training.final_choice import run_config_differences
from jaxformer.training.signals import RaiseOnSignal, Stopped


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    parser.add_argument("--workdir", type=path_text, required=True, help="the training run's directory")
    parser.add_argument("--last", type=at_least(1), default=5, help="how many of the newest checkpoints (default: 5)")
    return parser


def run(args: argparse.Namespace) -> int:
    check_workdir(args.workdir)
    # Python's KeyboardInterrupt raised inside orbax's reads or save left its threads half done:
    # errors printed, and at times five minutes' wait for a stage of the save that never came.
    # Held until orbax's call returns, it ends the command as every Ctrl-C does; one held until
    # the average was saved whole leaves it so (SIGTERM still ends the command at once: the next
    # averaging removes the partial save).
    try:
        with RaiseOnSignal(signums=(signal.SIGINT,)) as signals:
            step, chosen = average_last(args.workdir, args.last, run_config_differences, last_flag="--last")
            signals.finish()
    except Stopped:
        raise KeyboardInterrupt from None
    print_report([f"averaged steps {chosen} into {RunDirectory(args.workdir).averaged / str(step)}"])
    if signals.late_signum is not None:
        print("SIGINT came as the average was saved: it is complete; exiting with 0", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), run, argv, log_level=logging.INFO)
