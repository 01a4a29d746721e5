"""XLA compile time of the programs the test suite compiles most (the tiny model's train step and
its greedy and beam-4 searches) under each set of compiler options, interleaved in one run.

    python -m benchmarks.compile_time [--option NAME=KEY:VALUE[,KEY:VALUE]] [--iters 3]

The test suite is mostly compilation: on 2 CPU cores, XLA's backend compile took 287 of 409
seconds of a run of tests/model, tests/decoding/test_search.py and tests/training/test_step.py
(jax.monitoring's /jax/core/compile/backend_compile_duration; docs/test_suite.md). Each program
is traced and lowered afresh (untimed; jax's in-memory caches cleared first), then compiled (timed),
for every row in turn, one round of every row at a time, with the persistent compilation cache
off for the run (so `speedup`, the first row's median compile time over the row's, holds on a
busy machine). The rows (default: DEFAULT_OPTIONS)
are what `XLA_FLAGS="--KEY=VALUE"` would set for a whole process; tests/conftest.py sets the
`tests` row's options.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import numpy as np

from benchmarks.command_line import parse_args, parser, report
from benchmarks.common import jax_config, median
from benchmarks.xla_options import add_option_flag, check_options, chosen_options
from jaxformer.commands.common import FlagError
from jaxformer.decoding.generate import DecodeSettings, make_generate_fn
from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer
from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.state import make_init_fn
from jaxformer.training.step import make_train_step

COLUMNS = ("variant", "options", "programs", "compile_s", "speedup")

# The first row is the one the others are compared with.
DEFAULT_OPTIONS = {
    # LLVM at -O0: the tests' setting since their first trim (tests/conftest.py).
    "backend_O0": {"xla_backend_optimization_level": 0},
    # And XLA:CPU's older elemental emitters for fused loops instead of its MLIR fusion emitters.
    "tests": {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False},
    # XLA's defaults, what jaxformer's commands compile with.
    "xla_default": {},
}


def program_lowerings(layers: list[int]) -> dict[str, Callable[[], jax.stages.Lowered]]:
    """The tiny model's train step, greedy and beam-4 searches, one of each per layer count, as
    tests/training/test_step.py and tests/decoding build them: each a function that traces and
    lowers it anew."""
    programs = {}
    for count in layers:
        config = preset("tiny", vocab_size=48, num_encoder_layers=count, num_decoder_layers=count)
        experiment = default_config()
        experiment.training.loss_chunk_tokens = 8
        model = Transformer(config)
        optimizer, learning_rate = make_optimizer(experiment.optimizer, config.d_model)
        state = jax.eval_shape(make_init_fn(model, optimizer, 9, 8), 0)
        batch = {"inputs": np.full((4, 9), 5, np.int32), "targets": np.full((4, 8), 6, np.int32)}
        step = jax.jit(make_train_step(model, optimizer, learning_rate, experiment.training))
        programs[f"train_step_{count}"] = functools.partial(step.lower, state, batch)
        source = np.full((3, 6), 7, np.int32)
        for name, settings in (
            ("greedy", DecodeSettings(method="greedy", max_extra_length=4)),
            ("beam4", DecodeSettings(method="beam", beam_size=4, max_extra_length=4)),
        ):
            search = make_generate_fn(config, settings).jitted
            programs[f"{name}_{count}"] = functools.partial(search.lower, state.params, source, None)
    return programs


def compile_seconds(
    programs: dict[str, Callable[[], jax.stages.Lowered]], options: dict, iters: int
) -> dict[str, list[float]]:
    """{row: seconds to compile all `programs`, one figure a round}, rows in turn each round."""
    seconds = {name: [] for name in options}
    # Every compile compiles: the persistent cache would serve a row's second round.
    with jax_config("jax_enable_compilation_cache", False):
        for _ in range(iters):
            for name, values in options.items():
                jax.clear_caches()  # jax keeps each lowering, and each lowering's executable
                lowerings = [lower() for lower in programs.values()]
                start = time.perf_counter()
                for lowered in lowerings:
                    lowered.compile(values or None)
                seconds[name].append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> list[dict]:
    arguments = parser("compile_time", __doc__)
    add_option_flag(arguments, first="; the first is the reference")
    args = parse_args(arguments, argv)
    options = chosen_options(arguments, args.option, DEFAULT_OPTIONS)
    try:
        check_options(options)
    except FlagError as error:
        arguments.error(str(error))
    programs = program_lowerings([1] if args.smoke else [1, 2])
    rounds = args.iters or (1 if args.smoke else 3)
    seconds = {name: median(times) for name, times in compile_seconds(programs, options, rounds).items()}
    reference = next(iter(options))
    rows = [
        {
            "variant": name,
            "options": ",".join(f"{key}={value}" for key, value in values.items()),
            "programs": len(programs),
            "compile_s": seconds[name],
            "speedup": seconds[reference] / seconds[name],
        }
        for name, values in options.items()
    ]
    notes = [
        f"  compile_s: the median over rounds of compiling {', '.join(programs)} (cache off)",
        f"  speedup: the {reference} row's compile_s over the row's, timed interleaved in this run",
    ]
    return report("compile_time", rows, COLUMNS, args.json, "XLA compile time of the tests' programs", notes)


if __name__ == "__main__":
    main()
