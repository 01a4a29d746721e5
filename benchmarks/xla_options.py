"""XLA compiler options, and data parallelism over virtual CPU devices, against an experiment
config's own train step, interleaved in one run.

    python -m benchmarks.xla_options [--config multi30k] [--option NAME=KEY:VALUE[,KEY:VALUE]] [--devices N]

The `default` row is the train step as `jaxformer/training/loop.py` compiles it for the config
(`--config`: a shipped config's name or a file): its model, with `model.matmul_dtype` resolved for
this machine; its `training` section (R-Drop, loss chunks, label smoothing) and optimizer; under
its mesh's logical-axis rules, on one device; over one batch of the config's shape
(`data.batch_size` rows of `data.max_length` random tokens each side, one pair a row with its
segment ids and positions, as `jaxformer/training/pace.py` times configs for a sweep). Every
other row changes one thing, and all are timed in turn, one step of each per round, so `speedup`
(the default's median step time over the row's) holds on a busy machine:

- `--option NAME=KEY:VALUE[,KEY:VALUE]` (repeatable; default: DEFAULT_OPTIONS): the same program
  compiled with those XLA compiler options, as `XLA_FLAGS="--KEY=VALUE"` would set them for the
  whole process (`jax.jit(...).lower(...).compile(compiler_options=...)`).
- `data_parallel_N` (`--devices N`; default: the cores this process may run on, on a CPU): the same
  step over a mesh of N devices, the rows split over its data axis. On a CPU they are virtual
  devices (`jax_num_cpu_devices`) sharing the cores: each runs its share of the rows as a program
  of its own, beside XLA's intra-op threads, which leave the cores idle between small operations. N
  must divide the config's `data.batch_size` (an error naming --devices, before anything compiles,
  where it does not).
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np

from benchmarks.command_line import parse_args, parser, report
from benchmarks.common import cpu_count, median, time_interleaved
from jaxformer.commands.common import FlagError, at_least, path_text
from jaxformer.errors import UserError
from jaxformer.training import sharding
from jaxformer.training.config_file import load_config
from jaxformer.training.experiment import model_config
from jaxformer.training.pace import ConfigTrainStep

COLUMNS = ("config", "variant", "devices", "options", "batch", "length", "step_ms", "tokens_per_s", "speedup")

# XLA:CPU options that could change a small model's step time (jax 0.10.2's XLA).
DEFAULT_OPTIONS = {
    # A scheduler that orders independent operations so that more of them can run at once.
    "concurrency_scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
    # 512-bit vectors in XLA's own loops (fusions) on AVX-512 CPUs; the default prefers 256.
    "vector_width_512": {"xla_cpu_prefer_vector_width": 512},
    # Fast math in the fusions (reassociation, approximate functions): other numerics, so a
    # measure of what exactness costs, not a setting to train with.
    "fast_math": {"xla_cpu_enable_fast_math": True},
}
SMOKE_OPTIONS = {"concurrency_scheduler": DEFAULT_OPTIONS["concurrency_scheduler"]}


def option_value(text: str) -> bool | int | float | str:
    """An option's value from the command line: true/false, an integer, a float, or the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_option(text: str) -> tuple[str, dict]:
    """`NAME=KEY:VALUE[,KEY:VALUE]` -> (NAME, {KEY: VALUE}); an argparse type (a bad one is an
    ArgumentTypeError naming it)."""
    name, _, pairs = text.partition("=")
    options = {}
    for pair in pairs.split(","):
        key, sep, value = pair.partition(":")
        if not (name.strip() and sep and key.strip() and value.strip()):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected NAME=KEY:VALUE[,KEY:VALUE], e.g. fast=xla_cpu_enable_fast_math:true"
            )
        if key.strip() in options:
            raise argparse.ArgumentTypeError(f"{text!r}: {key.strip()} is given twice")
        options[key.strip()] = option_value(value.strip())
    if name == "default":
        raise argparse.ArgumentTypeError(f"{text!r}: `default` is the row without options; name the row otherwise")
    return name, options


parse_option.__name__ = "NAME=KEY:VALUE[,KEY:VALUE]"


def use_devices(count: int) -> list:
    """The first `count` devices, adding virtual CPU devices where jax's backend has not started
    (a process started with XLA_FLAGS' host_platform_device_count keeps its count)."""
    if count > 1 and "host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError:  # the backend already runs with its devices
            pass
    devices = jax.devices()
    if len(devices) < count:
        raise FlagError(f"argument --devices: {count} asked, this process has {len(devices)} ({devices[0].platform})")
    return devices[:count]


def add_option_flag(arguments: argparse.ArgumentParser, first: str = "") -> None:
    """--option NAME=KEY:VALUE[,KEY:VALUE], repeatable: a row of compiler options (`first`: what
    the first row is, said in --help); read them with `chosen_options`."""
    arguments.add_argument(
        "--option",
        action="append",
        type=parse_option,
        default=None,
        metavar="NAME=KEY:VALUE[,KEY:VALUE]",
        help=f"a row of compiler options (repeatable, each NAME once{first}; default: DEFAULT_OPTIONS's rows)",
    )


def chosen_options(arguments: argparse.ArgumentParser, given: list | None, default: dict) -> dict[str, dict]:
    """The rows of compiler options: the --option rows `given` ((NAME, options) each, a NAME
    given twice an error), else `default`."""
    if not given:
        return default
    names = [name for name, _ in given]
    repeated = [name for name in names if names.count(name) > 1]
    if repeated:
        arguments.error(f"argument --option: the row name {repeated[0]!r} is given twice")
    return dict(given)


def check_options(options: dict[str, dict]) -> None:
    """Each row's compiler options, compiled once on a scalar function: an option XLA does not
    know (or a value of the wrong kind) is a FlagError naming the row, in a second, before the
    train steps take minutes to compile."""
    for name, values in options.items():
        try:
            jax.jit(lambda x: x + 1).lower(np.float32(0)).compile(values)
        except Exception as error:  # XlaRuntimeError / JaxRuntimeError: "INVALID_ARGUMENT: No such compile option"
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise FlagError(f"argument --option: row {name!r}: {reason}") from None


def check_meshes(config, variants: dict[str, tuple[int, dict]], devices: list, default_count: bool) -> None:
    """A FlagError for a row whose devices the config's mesh or batch cannot use (data.batch_size
    not divisible by the data-parallel shards, a mesh.shape of another device count), in
    milliseconds, before the steps take minutes to compile: naming --devices for the
    data-parallel row (`default_count`: the count was the process's cores), --config for a
    one-device row."""
    rules = sharding.rules_from_config(config.mesh.logical_axis_rules)
    for name, (count, _) in variants.items():
        try:
            sharding.check_rules(config.mesh.logical_axis_rules)
            sharding.check_batch_size(
                config.data.batch_size, sharding.make_mesh(config.mesh.shape, devices[:count]), rules
            )
        except sharding.MeshError as error:
            if count == 1:
                raise FlagError(f"argument --config: row {name!r} on one device: {error}") from None
            given = f"{count} (the default: the cores this process may run on)" if default_count else str(count)
            raise FlagError(
                f"argument --devices: {given}, row {name!r}: {error}; pass --devices with a count that divides "
                f"data.batch_size={config.data.batch_size} (1: no data-parallel row)"
            ) from None


def experiment_steps(config, variants: dict[str, tuple[int, dict]], devices: list) -> dict[str, ConfigTrainStep]:
    """{row: the config's train step as the training loop builds it (jaxformer/training/pace.py),
    on `devices[:k]`, compiled with those compiler options} for `variants` {row: (k, options)}.
    Every row's step is built (traced and lowered) before any compiles, so that a row that cannot
    be fails before minutes of compilation."""
    steps = {name: ConfigTrainStep(config, devices=devices[:count]) for name, (count, _) in variants.items()}
    for name, (_, options) in variants.items():
        steps[name].compile(options or None)
    return steps


def main(argv=None) -> list[dict]:
    arguments = parser("xla_options", __doc__)
    arguments.add_argument(
        "--config",
        type=path_text,
        default=None,
        help="an experiment config: a shipped name or a file (default multi30k; not with --smoke, which uses tiny)",
    )
    add_option_flag(arguments)
    arguments.add_argument(
        "--devices",
        type=at_least(1),
        default=None,
        help="the data_parallel row's devices (default: the cores, on a CPU; 1: no such row)",
    )
    args = parse_args(arguments, argv, smoke_sets={"config": "multi30k"})
    options = chosen_options(arguments, args.option, SMOKE_OPTIONS if args.smoke else DEFAULT_OPTIONS)
    try:
        config = load_config("tiny" if args.smoke else args.config)
    except UserError as error:
        arguments.error(f"argument --config: {error}")
    count = args.devices if args.devices is not None else (2 if args.smoke else cpu_count())
    try:
        devices = use_devices(count)
    except FlagError as error:
        arguments.error(str(error))
    if args.devices is None and devices[0].platform != "cpu":
        devices = devices[:1]  # no virtual devices beside an accelerator: pass --devices for real ones
    variants = {"default": (1, {}), **{name: (1, values) for name, values in options.items()}}
    if len(devices) > 1:
        variants[f"data_parallel_{len(devices)}"] = (len(devices), {})
    try:
        check_meshes(config, variants, devices, default_count=args.devices is None)
        check_options(options)
    except FlagError as error:
        arguments.error(str(error))
    steps = experiment_steps(config, variants, devices)
    seconds = {
        name: median(times) for name, times in time_interleaved(steps, args.iters or (2 if args.smoke else 10)).items()
    }
    batch, length = config.data.batch_size, config.data.max_length
    rows = [
        {
            "config": "tiny" if args.smoke else args.config,
            "variant": name,
            "devices": count,
            "options": ",".join(f"{key}={value}" for key, value in values.items()),
            "batch": batch,
            "length": length,
            "step_ms": 1000 * seconds[name],
            "tokens_per_s": batch * length / seconds[name],
            "speedup": seconds["default"] / seconds[name],
        }
        for name, (count, values) in variants.items()
    ]
    training = config.training
    matmul_dtype = model_config(config, config.tokenizer.vocab_size).matmul_dtype or "float32"
    notes = [
        "  speedup: the default row's median step time over the row's, timed interleaved in this run",
        f"  the config's own step: matmul_dtype {matmul_dtype}, "
        f"R-Drop alpha {training.rdrop_alpha}, loss chunks of {training.loss_chunk_tokens} tokens, "
        f"label smoothing {training.label_smoothing}; {devices[0].platform}",
    ]
    return report("xla_options", rows, COLUMNS, args.json, "XLA options and devices, interleaved", notes)


if __name__ == "__main__":
    main()
