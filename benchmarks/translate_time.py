"""Wall time of whole `jaxformer-translate` processes, start to exit, cold and warm: Multi30k's
test_2016_flickr (1,000 English sentences) by default, beam 4.

    python -m benchmarks.translate_time --workdir runs/m30k [--checkpoint final] [--rounds 2]
        [--beam_size 4] [--input FILE] [--json FILE]

Each row is one process translating the whole input (what `time jaxformer-translate < in > out`
measures: interpreter start, imports, checkpoint, compilations, decoding) with the default
flags but one, in one of these variants:

  stop    --stop exact, current_length (the default) or beam_full: when beam search stops a
          sentence (jaxformer/decoding/beam_search.py)
  cache   cold:   a fresh, empty persistent compilation cache directory
          warm:   the same directory, second process

Each round runs every variant once, in turn, so that load on a shared machine falls on all of
them alike; compare ratios within a run, not numbers across runs. The median over rounds is
reported, with CPU seconds (user + system), which move less with the machine's load than wall
time does. `same` counts the output lines equal to those of the first variant (exact, cold).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from jaxformer.commands.common import (
    FlagError,
    Parser,
    at_least,
    path_text,
)
from jaxformer.commands.decoding_flags import checkpoint_choice
from jaxformer.commands.path_checks import check_readable_file, check_workdir, check_writable_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "jaxformer" / "data" / "raw" / "multi30k" / "test_2016_flickr.en.gz"
COLUMNS = (
    "stop",
    "cache",
    "lengths",
    "wall_s",
    "cpu_s",
    "start_s",
    "translate_s",
    "sentences_per_s",
    "wall_x",
    "cpu_x",
    "same",
)
TIMES = ("wall_s", "cpu_s", "translate_s")
STOPS = ("exact", "current_length", "beam_full")
VARIANTS = tuple((stop, cache) for stop in STOPS for cache in ("cold", "warm"))

# The child: jaxformer-translate's main, with the Translator's translate timed (translate.py looks
# `translator_from_flags` up in its own namespace for this), and the lengths it compiled written
# to a file for the table.
CHILD = """
import json, sys, time
from jaxformer.commands import decoding_flags, translate

report = sys.argv[1]
built, seconds = [], {}

def translator_from_flags(args):
    translator = decoding_flags.translator_from_flags(args)
    built.append(translator)
    translate_sentences = translator.translate

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return translate_sentences(*args, **kwargs)
        finally:
            seconds["translate"] = time.perf_counter() - start

    translator.translate = timed
    return translator

translate.translator_from_flags = translator_from_flags
code = translate.main(sys.argv[2:])
with open(report, "w") as handle:
    json.dump({"lengths": built[0].compiled_lengths if built else [], **seconds}, handle)
sys.exit(code)
"""


def run_once(stop: str, cache: str, cache_dir: pathlib.Path, args, input_path: pathlib.Path, scratch: pathlib.Path):
    """One translate process: {"wall_s", "cpu_s", "translate_s", "lengths", "lines"}."""
    ours = ("JAX_COMPILATION_CACHE", "JAXFORMER_")  # the variant sets these
    env = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    output, report = scratch / "out.txt", scratch / "report.json"
    command = [sys.executable, "-c", CHILD, str(report), "--workdir", args.workdir]
    command += ["--checkpoint", str(args.checkpoint)]
    command += ["--beam_size", str(args.beam_size), "--stop", stop, "--no_progress"]
    command += ["--input", str(input_path), "--output", str(output), "--overwrite"]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [""]
        if lines[-1].startswith("error: "):  # the command's own one-line error
            print(f"error: translate ({stop}, cache {cache}): {lines[-1][len('error: ') :]}", file=sys.stderr)
            sys.exit(result.returncode)
        failed = f"translate ({stop}, cache {cache}) failed (exit {result.returncode})"
        sys.exit(f"error: {failed}:\n{result.stderr[-3000:]}")
    child = json.loads(report.read_text())
    return {
        "wall_s": wall,
        # CPU seconds move less than wall time with the load of a shared machine.
        "cpu_s": after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime,
        "translate_s": child["translate"],
        "lengths": child["lengths"],
        "lines": output.read_text(encoding="utf-8").splitlines(),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = Parser(
        prog="python -m benchmarks.translate_time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", required=True, type=path_text, help="a translation run's directory")
    parser.add_argument(
        "--checkpoint",
        default="latest",
        type=checkpoint_choice,
        help="latest (default), best, averaged, final or a step",
    )
    parser.add_argument(
        "--input", default=str(DEFAULT_INPUT), type=path_text, help="sentences, one a line (.gz or plain)"
    )
    parser.add_argument("--beam_size", type=at_least(1), default=4, help="beam size, >= 1 (default 4)")
    parser.add_argument(
        "--rounds", type=at_least(1), default=1, help="times each variant runs, >= 1 (median reported; default 1)"
    )
    parser.add_argument(
        "--json", metavar="FILE", type=path_text, help="also write the rows to FILE, one JSON object a line"
    )
    parser.add_argument("--overwrite", action="store_true", help="with --json: replace FILE if it exists")
    args = parser.parse_args(argv)
    if args.overwrite and args.json is None:
        parser.error("argument --overwrite: only with --json FILE")
    try:
        check_workdir(args.workdir)
        check_readable_file(args.input, "--input")
        check_writable_file(args.json, "--json", overwrite=args.overwrite, inputs={"--input": args.input})
    except FlagError as error:
        parser.error(str(error))

    from benchmarks.command_line import report  # imports jax: after --help and the flags' checks
    from benchmarks.common import cpu_count
    from jaxformer.data.parallel_text import read_lines
    from jaxformer.errors import UserError
    from jaxformer.run.loading import load_checkpoint

    try:  # the input's lines (UTF-8, a whole .gz) and the checkpoint's metadata, before any process is timed
        sentences = read_lines(args.input)
        if not sentences:  # six processes would time nothing: a table of start-up times
            raise FlagError(f"--input {args.input}: no lines to translate")
        load_checkpoint(args.workdir, args.checkpoint, params=False)
    except UserError as error:
        parser.error(str(error))

    runs: dict[tuple[str, str], list[dict]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="translate-time-") as scratch:
        scratch = pathlib.Path(scratch)
        input_path = scratch / "input.txt"
        input_path.write_text("".join(line + "\n" for line in sentences), encoding="utf-8")
        for round_index in range(args.rounds):
            for stop, cache in VARIANTS:
                cache_dir = scratch / f"cache-{stop}-{round_index}"  # cold: new; warm: the cold run's
                run = run_once(stop, cache, cache_dir, args, input_path, scratch)
                runs[(stop, cache)].append(run)
                print(
                    f"round {round_index + 1}: {stop:14} cache {cache:4} {run['wall_s']:6.1f} s, "
                    f"CPU {run['cpu_s']:6.1f} s",
                    file=sys.stderr,
                )

    reference = runs[VARIANTS[0]][0]["lines"]
    before = {key: statistics.median(run[key] for run in runs[VARIANTS[0]]) for key in ("wall_s", "cpu_s")}
    rows = []
    for (stop, cache), variant_runs in runs.items():
        wall, cpu, translate = (statistics.median(run[key] for run in variant_runs) for key in TIMES)
        same = min(sum(a == b for a, b in zip(run["lines"], reference)) for run in variant_runs)
        rows.append(
            {
                "stop": stop,
                "cache": cache,
                "lengths": "/".join(map(str, variant_runs[-1]["lengths"])),
                "wall_s": wall,
                "cpu_s": cpu,
                "start_s": wall - translate,
                "translate_s": translate,
                "sentences_per_s": len(sentences) / wall,
                "wall_x": before["wall_s"] / wall,
                "cpu_x": before["cpu_s"] / cpu,
                "same": f"{same}/{len(sentences)}",
                "rounds": len(variant_runs),
                "beam_size": args.beam_size,
            }
        )
    title = f"translate_time: {len(sentences)} sentences, beam {args.beam_size}, {cpu_count()} cores"
    notes = [
        "lengths: the source lengths compiled; start_s: wall_s - translate_s (interpreter, imports, checkpoint, exit);",
        "translate_s: Translator.translate (compilations and decoding); wall_x, cpu_x: speed-up over exact/cold",
    ]
    return report("translate_time", rows, COLUMNS, args.json, title, notes)


if __name__ == "__main__":
    main()
