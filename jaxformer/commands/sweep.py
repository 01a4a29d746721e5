"""Train one config once per variant and compare the variants on validation BLEU (`jaxformer-sweep`).

    jaxformer-sweep --config multi30k --sweep multi30k_hour --workdir runs/sweep
    jaxformer-sweep --config tiny --sweep my_sweep.py --workdir runs/tiny_sweep --config.training.num_train_steps=100

--sweep takes the name of a sweep shipped with jaxformer (jaxformer/configs/sweeps/) or the path
of a Python file whose get_sweep() returns {variant name: ["SECTION.KEY=VALUE", ...]}. Each
variant trains in WORKDIR/<variant name>, one after another, with the config's own budget; any
--config.SECTION.KEY=VALUE given here applies to every variant first. Every variant is built and
checked before the first one trains. A variant's score is the validation BLEU of its final choice
(training.final_choice); no test set is read. The table, highest first, is printed and written to
WORKDIR/sweep.md (and each row to WORKDIR/sweep.jsonl). Running the same command again trains only
the variants not yet finished (resuming the one that was stopped).

--baseline_steps N replaces the wall-clock budget by a step budget that does not depend on the
machine's speed: the config as it is (with the shared --config overrides) would train N steps,
and each variant trains N times its steps a second over that config's, measured by timing their
train steps in turn before it trains (WORKDIR/pace/<variant>.json). On a fast or a slow machine,
or beside other jobs, every variant then gets the same compute. multi30k's 55-minute budget
buys about 4,750 steps of its d_model 192 model on the machine the README reports.

--seeds K trains each variant K times, seed k (0 to K-1) with training.seed and data.shuffle_seed
moved by k, in WORKDIR/<variant>@seed<k> (k = 0: WORKDIR/<variant>, so a one-seed sweep's runs
count as seed 0); the variant's score is the mean of its seeds', and the table shows each seed's.
A single hour run's score moves by most of a BLEU point with the seed alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys

from jaxformer.commands.common import FlagError, at_least, make_parser, path_text, run_command
from jaxformer.errors import EXIT_USER_ERROR, UserError, exit_code_for_signal
from jaxformer.files import write_text_atomically
from jaxformer.training.config_file import split_overrides


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    parser.add_argument("--config", required=True, help="the base config: a shipped config's name or a file's path")
    parser.add_argument("--sweep", required=True, help="a shipped sweep's name or a sweep file's path")
    parser.add_argument(
        "--workdir", type=path_text, required=True, help="the sweep's directory: one workdir per variant in it"
    )
    parser.add_argument(
        "--baseline_steps",
        type=at_least(1),
        default=None,
        help="a step budget instead of the config's wall-clock one: N steps for the config as it is, and for "
        "each variant N times its speed relative to it, measured side by side",
    )
    parser.add_argument(
        "--seeds",
        type=at_least(1),
        default=1,
        help="train each variant with this many seeds and rank by their mean validation BLEU (default: 1)",
    )
    return parser


def run(args: argparse.Namespace, overrides: list[tuple[str, str]]) -> int:
    from jaxformer.training.sweep import (
        check_step_budget,
        load_sweep,
        make_variants,
        reference_config,
        results_table,
        run_sweep,
    )

    variants = make_variants(args.config, load_sweep(args.sweep), overrides)
    reference = None if args.baseline_steps is None else reference_config(args.config, overrides)
    if args.baseline_steps is not None:
        check_step_budget(variants, args.baseline_steps)
    workdir = pathlib.Path(args.workdir).absolute()
    if workdir.exists() and not workdir.is_dir():
        raise FlagError(f"--workdir {workdir} exists and is not a directory")
    workdir.mkdir(parents=True, exist_ok=True)
    logging.info(
        "sweep %s over --config %s: %d variants x %d seeds in %s",
        args.sweep,
        args.config,
        len(variants),
        args.seeds,
        workdir,
    )
    rows, stopped_by = run_sweep(
        variants, workdir, baseline_steps=args.baseline_steps, reference=reference, seeds=args.seeds
    )
    table = results_table(rows)
    write_text_atomically(workdir / "sweep.md", table)
    write_text_atomically(workdir / "sweep.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    sys.stdout.write(table)
    if stopped_by is not None:
        logging.warning(
            "sweep stopped after %d of %d variants; run the same command to resume", len(rows), len(variants)
        )
        return exit_code_for_signal(stopped_by)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        overrides, rest = split_overrides(argv)
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        return EXIT_USER_ERROR
    return run_command(build_parser(), lambda args: run(args, overrides), rest, log_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
