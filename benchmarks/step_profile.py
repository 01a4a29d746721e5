"""Where the train step's time goes, jaxformer against the torch reference at the same shapes,
by component, from each framework's own profiler.

    python -m benchmarks.step_profile [--configs small,base] [--iters 6] [--profile-steps 3]
        [--torch] [--json FILE]

The steps are benchmarks.train_step's (the translator, dense random rows, the experiment
config's default training and optimizer sections; torch: benchmarks/torch_reference.py). First
both are timed interleaved (`step_ms`, the median wall time of a step), then each is profiled
alone for `--profile-steps` steps:

- jaxformer: `jax.profiler` traces the compiled step; each operation XLA ran (a fusion, a dot, a
  copy) is charged its own time on the thread that ran it (less the operations nested in it) and
  named by the HLO instruction's `op_name`: the jax function and flax module path it was traced
  from (for a fusion, that of the operation XLA names it after).
- torch: `torch.profiler` records every aten operator's self time; the gradient clipping and the
  optimizer update are the `optimizer_update` range of torch_reference's step.

Each side's operation time is split into COMPONENTS, as a share of its total (`jax_pct`,
`torch_pct`), and that share of the step's wall time (`jax_ms`, `torch_ms`): XLA runs
independent operations on its threads at once, so its operations' times add up to more than
the wall time (`jax_ops_over_wall`), while torch's run one after another. `torch_over_jax` is
the component's torch ms over jaxformer's (above 1: jaxformer spends less there). Where an
elementwise operation is fused into another (dropout's select into the residual sum, the
softmax into its neighbours) XLA charges it to the fusion's name, so the small components are
approximate; the attention core and the matmuls are dots and are not.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile

import jax

from benchmarks.command_line import add_configs_flag, check_torch, parse_args, parser, report
from benchmarks.common import (
    CONFIGS,
    SMOKE,
    TrainSteps,
    compile_timed,
    make_train,
    median,
    random_batch,
    time_interleaved,
)
from benchmarks.train_step import torch_step
from jaxformer.commands.common import at_least
from jaxformer.model.attention import ATTENTION_CORE

COMPONENTS = (
    "attention_core",  # Q K^T, the mask and softmax, dropout on the weights, the weighted sum of V
    "matmuls",  # every other product: Q, K, V, W^O, the feed-forward pair, the output projection
    "output_loss",  # the output softmax and label-smoothed cross-entropy around its product
    "layer_norm",
    "dropout",  # the masks and their selects where they are operations of their own
    "optimizer",  # gradient clipping and the Adam update (jaxformer: all its step does outside the gradient)
    "other",  # embeddings, residual sums, copies and transposes, activations
)
COLUMNS = (
    "config",
    "component",
    "jax_ms",
    "jax_pct",
    "torch_ms",
    "torch_pct",
    "torch_over_jax",
    "step_ms",
    "jax_ops_over_wall",
)

_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([^\s=]+) = .*?op_name="([^"]*)"', re.MULTILINE)

# aten operator name prefixes of each component (torch); the rest is "other".
_TORCH_OPERATORS = {
    "attention_core": (
        "aten::_scaled_dot_product",
        "aten::scaled_dot_product",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_softmax",
        "aten::softmax",
    ),
    "matmuls": ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::addmv", "aten::mv"),
    "output_loss": ("aten::_log_softmax", "aten::log_softmax", "aten::nll_loss", "aten::cross_entropy"),
    "layer_norm": ("aten::native_layer_norm", "aten::layer_norm"),
    "dropout": ("aten::bernoulli", "aten::native_dropout", "aten::dropout"),
}


def jax_component(op_name: str) -> str:
    """The component of an XLA operation, from its HLO `op_name` (the traced jax path)."""
    if "jvp(" not in op_name and "transpose(" not in op_name:
        return "optimizer"  # outside the gradient's computation: clipping, the update, the metrics
    if f"/{ATTENTION_CORE}/" in op_name:
        return "attention_core"  # not the Q and W^O products beside it in MultiHeadAttention.attend
    if op_name.endswith("dot_general"):
        return "matmuls"
    if "Transformer" not in op_name:
        return "output_loss"  # the gradient's computation outside the model: the fused output loss
    if "_norm/" in op_name:
        return "layer_norm"
    if "dropout" in op_name:
        return "dropout"
    return "other"


def torch_component(operator: str, ranges: tuple[str, ...]) -> str:
    """The component of a torch profiler event: its operator name, inside `ranges` (its ancestors)."""
    from benchmarks.torch_reference import OPTIMIZER_RANGE

    # The range's own self time (the Python between its operators) is the optimizer's too.
    if operator == OPTIMIZER_RANGE or OPTIMIZER_RANGE in ranges:
        return "optimizer"
    for component, prefixes in _TORCH_OPERATORS.items():
        if operator.startswith(prefixes):
            return component
    return "other"


def exclusive_times(events: list[tuple[str, int, int]]) -> dict[str, int]:
    """{name: total ns} of one thread's (name, start ns, duration ns) events, each less the
    events nested in it."""
    totals: collections.Counter = collections.Counter()
    stack: list[list] = []  # [name, end, exclusive ns]
    for name, start, duration in sorted(events, key=lambda event: (event[1], -event[2])):
        while stack and stack[-1][1] <= start:
            done = stack.pop()
            totals[done[0]] += done[2]
        if stack:
            stack[-1][2] -= duration
        stack.append([name, start + duration, duration])
    for name, _, exclusive in stack:
        totals[name] += exclusive
    return dict(totals)


def profile_jax(steps: TrainSteps, hlo_text: str, count: int) -> dict[str, float]:
    """{component: seconds per step} of the compiled step's operations over `count` steps."""
    op_names = dict(_INSTRUCTION.findall(hlo_text))
    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory)
        try:
            for _ in range(count):
                jax.block_until_ready(steps())
        finally:
            jax.profiler.stop_trace()
        (path,) = glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)
        profile = jax.profiler.ProfileData.from_file(path)
        seconds = dict.fromkeys(COMPONENTS, 0.0)
        for plane in profile.planes:
            for line in plane.lines:
                events = [(event.name, int(event.start_ns), int(event.duration_ns)) for event in line.events]
                for name, nanoseconds in exclusive_times(events).items():
                    if name in op_names:  # runtime events (the executor, pool waits) are not instructions
                        seconds[jax_component(op_names[name])] += nanoseconds / 1e9 / count
    return seconds


def profile_torch(step, count: int) -> dict[str, float]:
    """{component: seconds per step} of the torch step's operators' self times over `count` steps."""
    from torch.profiler import ProfilerActivity, profile

    # Kineto, torch's profiler library, logs `USDT:... profiler_start` / `profiler_stop` on stderr
    # around every profile, at its highest level (USDT, 5, above ERROR); it reads KINETO_LOG_LEVEL
    # when the process's first profile starts. A level set by the user is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(count):
            step()
    seconds = dict.fromkeys(COMPONENTS, 0.0)
    for event in profiler.events():
        ranges, parent = [], event.cpu_parent
        while parent is not None:
            ranges.append(parent.name)
            parent = parent.cpu_parent
        seconds[torch_component(event.name, tuple(ranges))] += event.self_cpu_time_total / 1e6 / count
    return seconds


def bench(name: str, config, batch: int, source_length: int, target_length: int, args, with_torch: bool):
    """One config's rows: one per component, then `step` (the wall time)."""
    data = random_batch(0, config, batch, source_length, target_length)
    state, train_fn = make_train(config, source_length, target_length)
    compiled, _ = compile_timed(train_fn, state, data)
    calls = {"jaxformer": TrainSteps(compiled, state, data)}
    if with_torch:
        calls["torch"] = torch_step(config, data)[1]
    wall = {impl: median(times) for impl, times in time_interleaved(calls, args.iters).items()}
    seconds = {"jaxformer": profile_jax(calls["jaxformer"], compiled.as_text(), args.profile_steps)}
    if with_torch:
        seconds["torch"] = profile_torch(calls["torch"], args.profile_steps)
    totals = {impl: sum(parts.values()) for impl, parts in seconds.items()}
    rows = []
    for component in (*COMPONENTS, "step"):
        row = {"config": name, "component": component}
        for impl, prefix in (("jaxformer", "jax"), ("torch", "torch")):
            if impl in seconds:
                share = 1.0 if component == "step" else seconds[impl][component] / totals[impl]
                row[f"{prefix}_pct"] = 100.0 * share
                row[f"{prefix}_ms"] = 1e3 * share * wall[impl]
        if with_torch and row["jax_ms"] > 0:
            row["torch_over_jax"] = row["torch_ms"] / row["jax_ms"]
        rows.append(row)
    rows[-1].update(step_ms=1e3 * wall["jaxformer"], jax_ops_over_wall=totals["jaxformer"] / wall["jaxformer"])
    return rows


def main(argv=None) -> list[dict]:
    arguments = parser("step_profile", __doc__, torch=True)
    default_configs = ["small", "base"]
    add_configs_flag(arguments, default_configs)
    arguments.add_argument(
        "--profile-steps", type=at_least(1), default=None, help="steps profiled per side (default 3; --smoke: 1)"
    )
    args = parse_args(arguments, argv, smoke_sets={"configs": default_configs})
    with_torch = check_torch(args)
    setups = [("smoke", *SMOKE)] if args.smoke else [(name, *CONFIGS[name]()) for name in args.configs]
    args.iters = args.iters or (2 if args.smoke else 6)
    args.profile_steps = args.profile_steps or (1 if args.smoke else 3)
    rows = []
    for name, config, batch, source_length, target_length in setups:
        rows += bench(name, config, batch, source_length, target_length, args, with_torch)
    notes = [
        "  jax_ms / torch_ms: the component's share of the side's operation time, times its median step",
        f"  ({args.iters} steps timed interleaved); {args.profile_steps} step(s) profiled per side;"
        " float32, dropout on",
        "  torch_over_jax above 1: jaxformer spends less time there",
    ]
    return report("step_profile", rows, COLUMNS, args.json, "train step by component, each side's profiler", notes)


if __name__ == "__main__":
    main()
