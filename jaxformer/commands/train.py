"""Train a jaxformer translation model.

    python train.py --config configs/multi30k.py --workdir runs/m30k
    python train.py --config configs/multi30k.py --workdir runs/m30k --config.model.num_encoder_layers=4

Any config key can be set with --config.SECTION.KEY=VALUE; --print_config prints every key with
its value (jaxformer/training/experiment.py documents them). Running the same command again
resumes from the newest checkpoint in the workdir. SIGTERM or Ctrl-C saves a checkpoint and
stops with exit code 128 + the signal number (143, 130): requeue such a run; 0 means finished.
"""

from __future__ import annotations

import argparse
import logging
import sys

from jaxformer.commands.common import FlagError, make_parser, run_command
from jaxformer.errors import EXIT_USER_ERROR, UserError, exit_code_for_signal
from jaxformer.training.config_file import apply_overrides, load_config_file, split_overrides


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    parser.add_argument("--config", required=True, help="experiment config file (configs/*.py)")
    parser.add_argument("--workdir", required=True, help="directory for checkpoints, the tokenizer and metrics")
    parser.add_argument(
        "--print_config", action="store_true", help="print the config with the overrides applied, then exit"
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run via jax.distributed (auto-detected on TPU pods, SLURM)",
    )
    parser.add_argument(
        "--coordinator_address", help="host:port of process 0, for a multi-process run launched by hand"
    )
    parser.add_argument("--num_processes", type=int, help="number of processes in a multi-process run launched by hand")
    parser.add_argument("--process_id", type=int, help="this process's index in a multi-process run launched by hand")
    return parser


def run(args: argparse.Namespace) -> int:
    from jaxformer.training import experiment

    config = load_config_file(args.config)
    apply_overrides(config, args.overrides)
    experiment.validate(config)  # every value, before anything is prepared, compiled or written
    if args.print_config:
        print(config)
        return 0
    if (args.num_processes is None) != (args.process_id is None) or (
        args.num_processes is not None and not 0 <= args.process_id < args.num_processes
    ):
        raise FlagError(
            f"--num_processes={args.num_processes} and --process_id={args.process_id}: give both, "
            "with 0 <= process_id < num_processes"
        )
    import jax

    if args.distributed or args.coordinator_address:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes (GPU/TPU ignore it)
        jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
        logging.info("process %d of %d", jax.process_index(), jax.process_count())

    from jaxformer.training.loop import train_and_evaluate

    last = train_and_evaluate(config, args.workdir)
    if last.get("stopped_by_signal"):
        return exit_code_for_signal(last["stopped_by_signal"])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        overrides, rest = split_overrides(argv)
    except UserError as error:  # a dangling --config.KEY
        sys.stderr.write(f"error: {error}\n")
        return EXIT_USER_ERROR

    def body(args: argparse.Namespace) -> int:
        args.overrides = overrides
        return run(args)

    return run_command(parser, body, rest, log_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
