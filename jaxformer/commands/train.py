"""Train a jaxformer translation model (`jaxformer-train`; `python train.py` in a clone).

    jaxformer-train --config multi30k --workdir runs/m30k
    jaxformer-train --config multi30k --workdir runs/m30k --config.model.num_encoder_layers=4
    jaxformer-train --config path/to/my_config.py --workdir runs/mine

--config takes the name of a config shipped with jaxformer (multi30k, tiny, wmt14_base, ...;
--list_configs lists them, each with its summary) or the path of a config file of your own: a Python
file whose get_config() returns the experiment's ConfigDict (start from a copy of a shipped one).
Any config key can be set with --config.SECTION.KEY=VALUE; to list every key with its value,
run with --print_config (jaxformer/training/experiment.py documents them).

Running the same command again resumes from the newest checkpoint in the workdir. At the end
the run's summary says where the checkpoints are and how to translate with them. SIGTERM or
Ctrl-C saves a checkpoint and stops with exit code 128 + the signal number (143, 130): requeue
such a run; 0 means finished.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.train")

import argparse
import contextlib
import copy
import functools
import logging
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from jaxformer.argument_parser import Parser
from jaxformer.commands import failed_exit, launch
from jaxformer.commands.common import (
    FlagError,
    at_least,
    configure_logging,
    make_parser,
    path_text,
    run_command,
    writing_stdout,
)
from jaxformer.errors import EXIT_USER_ERROR, UserError, exit_code_for_signal
from jaxformer.training.config_file import (
    OVERRIDE_PREFIX,
    apply_overrides,
    config_summary,
    load_config,
    packaged_config_directory,
    packaged_config_names,
    split_overrides,
)

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    # --config and --workdir are required but for --print_config and --list_configs, which argparse
    # cannot say: the usage names the three forms.
    parser.usage = (
        "%(prog)s [-h] [--verbose] --config CONFIG --workdir WORKDIR [--config.KEY=VALUE ...]\n"
        "       [--distributed | --coordinator_address HOST:PORT --num_processes N --process_id I]\n"
        "       %(prog)s --config CONFIG [--config.KEY=VALUE ...] --print_config\n"
        "       %(prog)s --list_configs"
    )
    parser.add_argument(
        "--config",
        help="required: a shipped config's name (multi30k, tiny, ...: see --list_configs) or a config file's path",
    )
    parser.add_argument(
        "--workdir", type=path_text, help="required: directory for checkpoints, the tokenizer and metrics"
    )
    parser.add_argument(
        "--print_config",
        action="store_true",
        help="print every config key with its value (overrides applied), then exit; needs no --workdir",
    )
    parser.add_argument(
        "--list_configs", action="store_true", help="list the configs shipped with jaxformer, then exit"
    )
    add_launch_flags(parser)
    return parser


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that join a multi-process run (build_parser's, and `flags_to_join`'s alone)."""
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run via jax.distributed (auto-detected on TPU pods, SLURM)",
    )
    parser.add_argument(
        "--coordinator_address", help="host:port of process 0, for a multi-process run launched by hand"
    )
    # at_least: "must be an integer >= 1, got 'x'", as every command's numbers say it (not "invalid int value").
    parser.add_argument(
        "--num_processes", type=at_least(1), help="number of processes in a multi-process run launched by hand"
    )
    parser.add_argument(
        "--process_id", type=at_least(0), help="this process's index in a multi-process run launched by hand"
    )


def list_configs() -> str:
    directory = packaged_config_directory()
    lines = [f"configs shipped with jaxformer (in {directory}); use one with --config NAME:"]
    names = packaged_config_names()
    width = max(map(len, names), default=0)
    lines += [f"  {name:<{width}}  {config_summary(directory / f'{name}.py')}" for name in names]
    return "\n".join(lines) + "\n"


def check_distributed_flags(args: argparse.Namespace) -> None:
    """The multi-process flags make one launch: by hand, --coordinator_address host:port with
    --num_processes and --process_id; or --distributed, which finds them on a TPU pod or SLURM."""
    if (args.num_processes is None) != (args.process_id is None) or (
        args.num_processes is not None and not 0 <= args.process_id < args.num_processes
    ):
        raise FlagError(
            f"--num_processes={args.num_processes} and --process_id={args.process_id}: give both, "
            "with 0 <= process_id < num_processes"
        )
    if args.coordinator_address is not None:  # first: an empty one is given, not missing
        host, _, port = args.coordinator_address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise FlagError(
                f"--coordinator_address={args.coordinator_address!r}: must be host:port, e.g. 10.0.0.2:1234"
            )
    if args.num_processes is not None and not (args.coordinator_address or args.distributed):
        raise FlagError(
            f"--num_processes={args.num_processes} and --process_id={args.process_id} need "
            "--coordinator_address=host:port (process 0's), or --distributed"
        )
    if args.coordinator_address is not None:
        if args.num_processes is None and not args.distributed:
            raise FlagError(
                f"--coordinator_address={args.coordinator_address} needs --num_processes and --process_id "
                "(or --distributed, where the cluster gives them)"
            )


def join_processes(args: argparse.Namespace) -> None:
    """jax.distributed.initialize from the flags. jax waits for every process to connect (up to its
    initialization timeout, 5 minutes, after which it ends the process): the log says so first."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes (GPU/TPU ignore it)
    where = "--distributed" if args.coordinator_address is None else f"--coordinator_address={args.coordinator_address}"
    if args.coordinator_address is not None:  # by hand, where a process not started is the likely wait
        logger.info("joining the multi-process run (%s); jax waits up to 5 minutes for every process", where)
    try:
        jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    except (ValueError, RuntimeError) as error:  # no cluster found, a coordinator that refuses
        raise FlagError(f"{where}: cannot join a multi-process run: {error}") from None
    logger.info("process %d of %d", jax.process_index(), jax.process_count())
    failed_exit.joined_run(jax.process_index(), jax.process_count())  # a failure then ends it within seconds
    from jaxformer.training import processes

    processes.check_same_device_counts()  # before the first gather, which needs them equal


def joins(args: argparse.Namespace) -> bool:
    """Whether the command line joins a multi-process run (--print_config alone never does)."""
    return bool(args.distributed or args.coordinator_address) and not args.print_config


def _raise_usage_error(parser: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
    def refuse(message: str) -> NoReturn:
        raise FlagError(f"{message}; see {parser.prog} --help")

    return refuse


def check_command_line(
    parser: argparse.ArgumentParser, arguments: list[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """`split_overrides(arguments)`, once every error of the command line itself (an override given
    twice or without a value, a flag argparse refuses, --config or --workdir missing) has been
    found: each is raised, a FlagError or ConfigError, where argparse would print it and exit."""
    overrides, rest = split_overrides(arguments)
    strict = copy.copy(parser)
    strict.error = _raise_usage_error(parser)  # argparse reports through error(); --help still exits
    args = strict.parse_args(rest)
    if args.list_configs:
        refuse_what_list_configs_ignores(parser, args, overrides)
        return overrides, rest
    missing = [flag for flag in ("config", "workdir") if getattr(args, flag) is None]
    if args.print_config and "workdir" in missing:
        missing.remove("workdir")
    if missing:
        flags = ", ".join("--" + flag for flag in missing)
        raise FlagError(f"the following arguments are required: {flags}; see {parser.prog} --help")
    return overrides, rest


def refuse_what_list_configs_ignores(
    parser: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[tuple[str, str]]
) -> None:
    """--list_configs lists every shipped config and reads nothing else: a --config, --workdir,
    --print_config or key given with it would be ignored unseen, so it is a FlagError instead."""
    given = [f"--config {args.config}"] if args.config is not None else []
    given += [f"--workdir {args.workdir}"] if args.workdir is not None else []
    given += ["--print_config"] if args.print_config else []
    given += [f"{OVERRIDE_PREFIX}{key}={text}" for key, text in overrides]
    if given:
        one_config = f"; for one config's keys and values: --config {args.config} --print_config" if args.config else ""
        raise FlagError(
            f"--list_configs lists every shipped config and takes no {', '.join(given)}{one_config}; "
            f"see {parser.prog} --help"
        )


def flags_to_join(arguments: list[str]) -> argparse.Namespace | None:
    """The launch flags of a command line that is wrong elsewhere, read alone; None where they do
    not join a run (or cannot: they are wrong too), so that no other process waits for this one."""
    parser = Parser(add_help=False)
    for flag in ("--verbose", "--print_config", "--list_configs"):
        parser.add_argument(flag, action="store_true")
    add_launch_flags(parser)
    parser.error = _raise_usage_error(parser)
    try:
        args, _ = parser.parse_known_args(arguments)
        check_distributed_flags(args)
    except UserError:
        return None
    return args if joins(args) and not args.list_configs else None


def stop_every_process(error: UserError, arguments: list[str]) -> int:
    """Reports an error of the command line in one line. Where the command line joins a run, it
    joins first and raises the error in every process (the others quote it), as a config error
    is: leaving first would leave them waiting 5 minutes for this process, then abort."""
    launch_flags = flags_to_join(arguments)
    if launch_flags is not None:
        from jaxformer.training import processes

        configure_logging(logging.INFO, launch_flags.verbose)
        with contextlib.suppress(UserError):  # this process's own error is the one to report
            join_processes(launch_flags)
            processes.all_or_none(functools.partial(_raise, error))
    sys.stderr.write(f"error: {error}\n")
    return EXIT_USER_ERROR


def _raise(error: Exception) -> NoReturn:
    raise error


def run(args: argparse.Namespace) -> int:
    from jaxformer.training import experiment, processes

    check_distributed_flags(args)
    if joins(args):
        join_processes(args)  # first: a config error in one process is then an error in every one

    def checked_config():
        config = load_config(args.config)
        apply_overrides(config, args.overrides)
        experiment.validate(config, args.workdir)  # every value, before anything is prepared, compiled or written
        return config

    config = processes.all_or_none(checked_config)
    if args.print_config:
        with writing_stdout():
            print(config)
        return 0
    import jax

    from jaxformer.commands.run_summary import run_summary
    from jaxformer.training.loop import train_and_evaluate

    start = time.perf_counter()
    # Once the run's work is done, a signal changes nothing: the launcher's handlers take them, before
    # the run's are given back, and keep the exit code through the summary and Python's exit.
    last = train_and_evaluate(config, args.workdir, on_complete=lambda last: launch.keep_exit_code(exit_code(last)))
    if "step" not in last:  # stopped by a signal before its first step: no run to summarise
        return exit_code(last)
    # Every process reads the workdir for the summary: orbax's checkpoint managers synchronise all
    # processes when they open, so process 0 alone would wait for the others forever.
    summary = run_summary(config, args.workdir, last, time.perf_counter() - start)
    if jax.process_index() == 0:
        logger.info("%s", "\n  ".join(summary))
    return exit_code(last)


def exit_code(last: dict) -> int:
    """The exit code of a run that returned `last`: 128 + the number of the signal that stopped it, or 0."""
    return exit_code_for_signal(last["stopped_by_signal"]) if last.get("stopped_by_signal") else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        overrides, rest = check_command_line(parser, argv)
    except UserError as error:
        return stop_every_process(error, argv)

    def body(args: argparse.Namespace) -> int:
        if args.list_configs:
            with writing_stdout():
                sys.stdout.write(list_configs())
            return 0
        args.overrides = overrides
        return run(args)

    def compiles(args: argparse.Namespace) -> bool:  # --list_configs and --print_config only inform
        return not (args.list_configs or args.print_config)

    return run_command(parser, body, rest, log_level=logging.INFO, compiles=compiles)
