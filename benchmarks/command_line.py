"""The benchmarks' command line and output: shared flags (`parser`, `parse_args`), list types,
and `report`, which prints the table and the JSON lines and writes --json.

Every benchmark runs on JAX's default device and prints a table, then one line per row
starting with `JSON ` (and writes the same rows, one JSON object a line, to `--json FILE`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from benchmarks.common import CONFIGS, torch_available
from jaxformer.commands.common import FlagError, Parser, at_least, number, path_text
from jaxformer.commands.path_checks import check_writable_file


def summary(doc: str) -> str:
    """A module docstring's first paragraph, on one line: a benchmark's --help description."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def names(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of `choices`, none repeated."""
    return comma_separated(lambda text: text, f"names from {', '.join(choices)}", choices)


def positive_integers(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1."""
    return comma_separated(at_least(1), "integers >= 1")(text)


def comma_separated(item: Callable[[str], Any], what: str, choices: Sequence[str] = ()) -> Callable[[str], list]:
    """An argparse type: a comma-separated list, each item through `item` (and one of `choices`,
    when given), none empty or repeated."""

    def parse(text: str) -> list:
        values = []
        for piece in text.split(","):
            if not piece.strip():
                raise argparse.ArgumentTypeError(f"must be comma-separated {what}, got {text!r}")
            try:
                value = item(piece.strip())
            except argparse.ArgumentTypeError as error:
                raise argparse.ArgumentTypeError(f"{error} (in {text!r})") from None
            if choices and value not in choices:
                raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(choices)}")
            if value in values:
                raise argparse.ArgumentTypeError(f"{value!r} is given twice")
            values.append(value)
        return values

    parse.__name__ = f"comma-separated {what}"
    return parse


def parser(name: str, doc: str, budget_of: str | None = None, torch: bool = False) -> Parser:
    """The shared options of benchmark `name` (its module's docstring `doc` gives the --help
    description); with `budget_of` ("a row", "a length") also --budget-s, the seconds of timed
    calls after which timing `budget_of` stops; with `torch` (the benchmarks that time the torch
    reference) --torch and --torch-threads. Errors are one line and exit 2 (`Parser`). Parse with
    `parse_args`, which checks --json before any work."""
    result = Parser(prog=f"python -m benchmarks.{name}", description=summary(doc))
    if budget_of:
        result.add_argument(
            "--budget-s",
            type=number(0.0, inclusive=True),
            default=60.0,
            help=f"stop timing {budget_of} after this many seconds of timed calls, keeping at least one "
            "(default 60; 0: one timed call)",
        )
    result.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and a couple of timed steps: a check that it runs; the numbers mean nothing. Not "
        "with the flags whose values it sets itself (their help says `not with --smoke`)",
    )
    result.add_argument(
        "--iters", type=at_least(1), default=None, help="timed iterations per row, >= 1 (median reported)"
    )
    result.add_argument(
        "--json",
        metavar="FILE",
        type=path_text,
        default=None,
        help="also write the rows to FILE, one JSON object a line",
    )
    result.add_argument("--overwrite", action="store_true", help="with --json: replace FILE if it exists")
    if torch:
        result.add_argument("--torch", action="store_true", help="also time the PyTorch reference (needs torch)")
        result.add_argument(
            "--torch-threads",
            type=at_least(1),
            default=None,
            help="with --torch: torch intra-op threads, >= 1 (default: the cores available)",
        )
    return result


def add_configs_flag(arguments: argparse.ArgumentParser, default: Sequence[str]) -> None:
    """--configs: comma-separated names of `CONFIGS`; `default` is what the benchmark runs without
    it (and what --smoke sets, so pass it to `parse_args` as `smoke_sets={"configs": default}`)."""
    arguments.add_argument(
        "--configs",
        type=names(tuple(CONFIGS)),
        default=None,
        help=f"comma-separated, of {', '.join(CONFIGS)} (default {','.join(default)}; not with --smoke)",
    )


def parse_args(
    arguments: argparse.ArgumentParser, argv: Sequence[str] | None, smoke_sets: Mapping[str, Any] | None = None
) -> argparse.Namespace:
    """`arguments.parse_args(argv)`, checked before any work: --json must be writable (and new,
    unless --overwrite). `smoke_sets` {dest: default} names the flags (given `default=None` in the
    parser) whose values --smoke sets itself: with --smoke such a flag is an error; without, a
    flag not given gets its default here. --torch-threads is only with --torch, which it tunes."""
    args = arguments.parse_args(argv)
    flags = {action.dest: action.option_strings[0] for action in arguments._actions if action.option_strings}
    for dest, default in (smoke_sets or {}).items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
        elif args.smoke:
            arguments.error(f"argument {flags[dest]}: not allowed with argument --smoke, which sets it itself")
    if args.overwrite and args.json is None:
        arguments.error("argument --overwrite: only with --json FILE")
    if getattr(args, "torch_threads", None) is not None and not args.torch:  # it sets nothing without torch
        arguments.error("argument --torch-threads: only with --torch")
    try:
        check_writable_file(args.json, "--json", overwrite=args.overwrite)
    except FlagError as error:
        arguments.error(str(error))
    return args


def check_torch(args) -> bool:
    """Whether to run the torch rows: --torch given and torch installed (a note on stderr if not)."""
    if args.torch and not torch_available():
        print(
            "note: --torch given but torch is not installed or does not import (pip install 'jaxformer[torch]'); "
            "skipping torch rows",
            file=sys.stderr,
        )
    if not (args.torch and torch_available()):
        return False
    from benchmarks import torch_reference

    torch_reference.set_threads(args.torch_threads)
    return True


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            return str(value)
        if value == 0 or abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def report(
    benchmark: str,
    rows: list[dict[str, Any]],
    columns: Sequence[str],
    json_path: str | None = None,
    title: str | None = None,
    notes: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Prints `rows` as a table of `columns`, the `notes` (footnotes, a line each), then each row
    as a `JSON {...}` line; writes `json_path`."""
    rows = [{"benchmark": benchmark, **row} for row in rows]
    cells = [[_format(row.get(column, "")) for column in columns] for row in rows]
    widths = [max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)]
    print(f"\n== {title or benchmark} ({jax.devices()[0].platform}: {jax.devices()[0].device_kind}) ==")
    print("  ".join(column.rjust(width) for column, width in zip(columns, widths)))
    for line in cells:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))
    for note in notes:
        print(note)
    lines = [json.dumps({key: _plain(value) for key, value in row.items()}) for row in rows]
    for line in lines:
        print("JSON " + line)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
    return rows


def _plain(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
