"""Train one config once per variant and compare the variants on validation BLEU (`jaxformer-sweep`).

    jaxformer-sweep --config multi30k --sweep multi30k_hour --workdir runs/sweep
    jaxformer-sweep --config multi30k --sweep my_sweep.py --workdir runs/mine --config.training.time_budget_minutes=10

--sweep takes the name of a sweep shipped with jaxformer (jaxformer/configs/sweeps/) or the path
of a Python file whose get_sweep() returns {variant name: ["SECTION.KEY=VALUE", ...]}. Each
variant trains in WORKDIR/<variant name>, one after another, with the config's own budget; any
--config.SECTION.KEY=VALUE given here applies to every variant first. Every variant is built and
checked, and every run already in WORKDIR checked against it (its config, step budget and data
files), before the first one trains; one invocation at a time holds WORKDIR (WORKDIR/sweep.lock).
A variant's score is the validation BLEU of its final choice (training.final_choice); no test set
is read. The table, highest first, is printed and written to
WORKDIR/sweep.md (and each row to WORKDIR/sweep.jsonl). Running the same command again trains only
the variants not yet finished (resuming the one that was stopped). The rows of this invocation
replace the earlier ones of the same variants; an earlier row of a variant that has none in this
invocation (not in this sweep file, or not reached before a signal or an error stopped it) is kept,
marked "from an earlier invocation", and must have been scored on this invocation's validation pairs (each
row records them). Each variant's row is written as it finishes, so a stopped, failed or killed
sweep keeps the rows it finished.

--baseline_steps N replaces the wall-clock budget by a step budget that does not depend on the
machine's speed: the config as it is (with the shared --config overrides) would train N steps,
and each variant trains N times its steps a second over that config's, measured by timing their
train steps in turn before it trains (WORKDIR/pace/<variant>.json). On a fast or a slow machine,
or beside other jobs, every variant then gets the same compute (a variant's or this command's own
training.num_train_steps or training.time_budget_minutes is refused). multi30k's 55-minute budget
bought its d_model 160 model 4,110 to 4,960 steps on the 2-core AMD VMs of the README's
"Results: Multi30k en->de" (docs/multi30k_runs.md, 2026-12-02 and 2026-12-04).

--seeds K trains each variant K times, seed k (0 to K-1) with training.seed and data.shuffle_seed
moved by k, in WORKDIR/<variant>@seed<k> (k = 0: WORKDIR/<variant>, so a one-seed sweep's runs
count as seed 0); the variant's score is the mean of its seeds', and the table shows each seed's.
A single hour run's score moves by most of a BLEU point with the seed alone.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.sweep")

import argparse
import json
import logging
import math
import pathlib
import sys
from collections.abc import Collection, Sequence
from typing import Any

from jaxformer.commands.common import FlagError, at_least, make_parser, path_text, run_command
from jaxformer.errors import EXIT_USER_ERROR, UserError, exit_code_for_signal
from jaxformer.files import unwritable_folder_reason, write_text_atomically
from jaxformer.run.directory import SweepDirectory
from jaxformer.training.config_file import split_overrides

logger = logging.getLogger(__name__)


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
    from jaxformer.run.killed_writes import remove_killed_sweep_writes
    from jaxformer.run.lock import SweepLock
    from jaxformer.training.sweep import check_step_budget, make_variants, reference_config
    from jaxformer.training.sweep_checks import check_seed_runs
    from jaxformer.training.sweep_file import load_sweep
    from jaxformer.training.sweep_validation import check_seeds_share_validation

    variants = make_variants(args.config, load_sweep(args.sweep), overrides)
    check_seeds_share_validation(variants[0].config, args.seeds)
    check_seed_runs(variants, args.seeds)
    reference = None if args.baseline_steps is None else reference_config(args.config, overrides)
    if args.baseline_steps is not None:
        check_step_budget(variants, args.baseline_steps, overrides)
    workdir = pathlib.Path(args.workdir).absolute()
    # A file on the way, or a folder that takes no new entries, was mkdir's traceback.
    unwritable = unwritable_folder_reason(workdir)
    if unwritable is not None:
        raise FlagError(f"--workdir {workdir}: {unwritable}")
    created = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FlagError(f"--workdir {workdir}: cannot create it ({error.strerror})") from None
    try:
        # Held from reading sweep.jsonl to writing it again: a second invocation beside this one
        # would write its own rows over this one's, or this one over its.
        with SweepLock(workdir):
            remove_killed_sweep_writes(workdir)  # a sweep killed while it wrote its rows, table or a pace
            return _run_locked(args, variants, reference, workdir)
    finally:
        if created and not any(workdir.iterdir()):  # refused before writing anything: as it was
            workdir.rmdir()


def _run_locked(args: argparse.Namespace, variants, reference, workdir: pathlib.Path) -> int:
    from jaxformer.training.sweep import run_sweep
    from jaxformer.training.sweep_checks import unchecked_rows

    earlier = read_rows(workdir)  # before anything trains: a bad file costs no run's time
    logger.info(
        "sweep %s over --config %s: %d variants x %d seeds in %s",
        args.sweep,
        args.config,
        len(variants),
        args.seeds,
        workdir,
    )
    names = {variant.name for variant in variants}
    kept = [row for row in earlier if row["variant"] not in names]  # checked too: the table ranks them with the rest
    unchecked = unchecked_rows(kept, workdir)  # their validation pairs: the table says so
    rows = []
    try:
        _, stopped_by = run_sweep(
            variants,
            workdir,
            baseline_steps=args.baseline_steps,
            reference=reference,
            seeds=args.seeds,
            rows=rows,
            kept_rows=kept,
            # Each variant's row written as it finishes: a sweep killed outright (kill -9, the
            # machine lost) before the end keeps them, for a later invocation's table.
            on_row=lambda: write_results(workdir, earlier, rows, unchecked, log_kept=False),
        )
    finally:  # a variant's error too: the rows finished before it stay in the table
        table = write_results(workdir, earlier, rows, unchecked)
    sys.stdout.write(table)
    if stopped_by is not None:
        logger.warning(
            "sweep stopped after %d of %d variants; run the same command to resume", len(rows), len(variants)
        )
        return exit_code_for_signal(stopped_by)
    return 0


EARLIER = "from_earlier_invocation"  # set on a row kept from an earlier invocation's sweep.jsonl
UNCHECKED = "from an earlier invocation, validation pairs unchecked"  # the note of sweep_checks.unchecked_rows'
NUMBER = (int, float)
ROW_TYPES = {"variant": str, "changes": str, "steps": NUMBER, "train_minutes": NUMBER, "bleu": NUMBER, "chosen": str}


def read_rows(workdir: pathlib.Path) -> list[dict[str, Any]]:
    """The rows an earlier invocation wrote to WORKDIR/sweep.jsonl ([] when none), read before
    anything trains: a line the table cannot show is an error naming it, not a row dropped later,
    nor a table that fails once the sweep has trained."""
    sweep = SweepDirectory(workdir)
    path = sweep.rows_file
    for entry in (path, sweep.table_file):
        if entry.exists() and not entry.is_file():
            raise UserError(f"{entry} is a directory (or another non-file), where the sweep keeps a file: move it away")
    if not path.is_file():
        if sweep.table_file.exists():
            raise UserError(
                f"{sweep.table_file} has no {path.name} beside it, whose rows it shows and a sweep keeps: "
                f"restore {path}, or move {sweep.table_file.name} away"
            )
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from None
    rows, seen = [], set()
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise UserError(f"{path} line {number} is not a JSON object; fix or remove that line")
        problem = row_problem(row)
        if problem is not None:
            raise UserError(f"{path} line {number} is not a sweep row: {problem}; fix or remove that line")
        if row["variant"] in seen:
            raise UserError(f"{path} line {number}: a second row of variant {row['variant']!r}; remove one")
        seen.add(row["variant"])
        rows.append(row)
    return rows


def row_problem(row: dict[str, Any], seed_row: bool = False) -> str | None:
    """What the table could not show in a row of sweep.jsonl (a key missing, a value of the wrong
    type, a number that is not finite), or None; a variant's row may hold its seeds' rows."""
    from jaxformer.training.final_choice import CANDIDATES

    def finite(value) -> bool:
        return isinstance(value, NUMBER) and not isinstance(value, bool) and math.isfinite(value)

    def shown(value) -> str:
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    for key, kind in ROW_TYPES.items():
        if key not in row or row[key] is None:
            return f"its {key!r} is missing"
        if not (finite(row[key]) if kind is NUMBER else isinstance(row[key], kind)):
            return f"its {key!r} is {shown(row[key])}, not {'a finite number' if kind is NUMBER else 'a string'}"
    # None where not known: a pace without --baseline_steps, a score an older run did not keep.
    for key in ("speed", "alpha", "lowercase_bleu", "chrf", *(f"{name}_bleu" for name in CANDIDATES)):
        if row.get(key) is not None and not finite(row[key]):
            return f"its {key!r} is {shown(row[key])}, not a finite number or null"
    if seed_row:
        return None
    if row.get("validation") is not None and not isinstance(row["validation"], dict):
        return f"its 'validation' is {shown(row['validation'])}, not the JSON object of its validation settings"
    if EARLIER in row and not isinstance(row[EARLIER], bool):
        return f"its {EARLIER!r} is {shown(row[EARLIER])}, not true or false"
    bleus = row.get("seed_bleus", [])
    if not isinstance(bleus, list) or not all(finite(bleu) for bleu in bleus):
        return f"its 'seed_bleus' is {shown(bleus)}, not a list of finite numbers"
    seeds = row.get("seeds", [])
    if not isinstance(seeds, list):
        return f"its 'seeds' is {shown(seeds)}, not a list of its seeds' rows"
    for index, seed in enumerate(seeds):
        problem = row_problem(seed, seed_row=True) if isinstance(seed, dict) else "it is not a JSON object"
        if problem is not None:
            return f"its 'seeds' item {index}: {problem.removeprefix('its ')}"
    return None


def merge_rows(earlier: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """This invocation's `rows`, then each `earlier` row of a variant they have no row for, marked
    EARLIER: a finished run's row is never lost to a sweep file that leaves its variant out or a
    sweep that stopped before reaching it."""
    names = {row["variant"] for row in rows}
    return [*rows, *({**row, EARLIER: True} for row in earlier if row["variant"] not in names)]


def write_results(
    workdir: pathlib.Path,
    earlier: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    unchecked: Collection[str] = (),
    log_kept: bool = True,
) -> str:
    """Writes the merged rows to WORKDIR/sweep.jsonl and their table to WORKDIR/sweep.md, when this
    invocation finished any (else the files, the earlier rows, stay as they are); returns the table.
    `unchecked`: the kept rows' variants whose validation pairs could not be checked; `log_kept`:
    whether to name the kept rows' variants in the log (once, as the invocation ends)."""
    merged, sweep = merge_rows(earlier, rows), SweepDirectory(workdir)
    if not rows:  # stopped or refused before its first variant finished: nothing to add
        return results_table(merged, unchecked)
    kept = [row["variant"] for row in merged if row.get(EARLIER)]
    if kept and log_kept:
        logger.info(
            "sweep: keeping the rows an earlier invocation wrote for %s, which this one has none for "
            "(marked 'from an earlier invocation' in %s)",
            ", ".join(kept),
            sweep.table_file.name,
        )
    # The rows first, before the table is made: a table is rebuilt from them, not they from it.
    write_text_atomically(sweep.rows_file, "".join(json.dumps(row) + "\n" for row in merged))
    table = results_table(merged, unchecked)
    write_text_atomically(sweep.table_file, table)
    return table


def results_table(rows: Sequence[dict[str, Any]], unchecked: Collection[str] = ()) -> str:
    """A Markdown table of the rows, highest validation BLEU first; a `note` column marks the rows
    kept from an earlier invocation, which this one's sweep file or stop left untouched, and those
    of them (`unchecked`) whose validation pairs could not be checked against this one's. A `speed`
    column (relative to the config's) only when a row has one, as `--baseline_steps` rows do."""
    from jaxformer.training.final_choice import CANDIDATES

    def number(value, digits=2):
        return "" if value is None else f"{value:.{digits}f}"

    def alphas(row):  # each seed's; None: a run from before the final choice kept its alpha
        chosen = [seed.get("alpha") for seed in row.get("seeds", [row])]
        if all(alpha is None for alpha in chosen):  # none kept (greedy search or sampling, or older runs)
            return ""
        missing = "" if len(chosen) == 1 else "?"
        return ", ".join(missing if alpha is None else f"{alpha:g}" for alpha in chosen)

    def line(cells):
        return "| " + " | ".join(cells) + " |"

    several = any(len(row.get("seed_bleus", ())) > 1 for row in rows)
    notes = any(row.get(EARLIER) for row in rows)
    paced = any(row.get("speed") is not None for row in rows)
    columns = [
        *("variant", "changes", "steps"),
        *(["speed"] if paced else []),
        *("train minutes", "validation BLEU"),
        *(["per seed"] if several else []),
        *("chosen", "alpha", *CANDIDATES),
        *(["note"] if notes else []),
    ]
    lines = [line(columns), line(["---"] * len(columns))]
    for row in sorted(rows, key=lambda row: -row["bleu"]):
        per_seed = ", ".join(number(bleu) for bleu in row.get("seed_bleus", [row["bleu"]]))
        cells = [
            row["variant"],
            row["changes"],
            f"{row['steps']:,}",
            *([number(row.get("speed"))] if paced else []),
            number(row["train_minutes"], 1),
            f"**{number(row['bleu'])}**",
            *([per_seed] if several else []),
            row["chosen"],
            alphas(row),
            *(number(row.get(f"{name}_bleu")) for name in CANDIDATES),
            *([_note(row, unchecked)] if notes else []),
        ]
        lines.append(line(cells))
    return "\n".join(lines) + "\n"


def _note(row: dict[str, Any], unchecked: Collection[str]) -> str:
    if not row.get(EARLIER):
        return ""
    return UNCHECKED if row["variant"] in unchecked else "from an earlier invocation"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        overrides, rest = split_overrides(argv)
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        return EXIT_USER_ERROR
    return run_command(build_parser(), lambda args: run(args, overrides), rest, log_level=logging.INFO)
