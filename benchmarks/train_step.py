"""Fixed-shape train-step throughput and model-FLOPs utilisation (MFU).

    python -m benchmarks.train_step [--configs tiny,small,base] [--iters 10] [--torch] [--json FILE]

Each config trains on one batch of dense random rows (no padding) with the project's train step
(jaxformer.training.step.train_step, Adam + clipping, dropout on), jitted as the training loop
does. MFU is the analytic model FLOP rate (benchmarks.common.train_flops) over the float32
matmul rate of a jitted 2048 x 2048 `jnp.dot` measured in the same run: the median of 10 calls
(the statistic the step times use), measured before and after the rows, the higher of the two.
`mfu_vs_fastest_pct` is the stricter figure against the fastest single matmul call seen.
"""

from __future__ import annotations

from benchmarks.common import (
    CONFIGS,
    SMOKE,
    check_torch,
    compile_timed,
    make_train,
    matmul_rates_gflops,
    median,
    parser,
    random_batch,
    report,
    time_calls,
    time_train_steps,
    torch_matmul_peak_gflops,
    train_flops,
    xla_flops,
)
from jaxformer.training.state import count_parameters

COLUMNS = (
    "config",
    "impl",
    "batch",
    "src_len",
    "tgt_len",
    "params_M",
    "compile_s",
    "step_ms",
    "tokens_per_s",
    "model_gflop",
    "xla_gflop",
    "achieved_gflops",
    "peak_gflops",
    "mfu_pct",
    "mfu_vs_fastest_pct",
    "jax_over_torch",
)


def bench_jax(
    name: str, config, batch: int, source_length: int, target_length: int, iters: int, budget_s: float
) -> tuple[dict, dict]:
    """One jaxformer row, and the batch it trained on (for the torch row)."""
    state, train_fn = make_train(config, source_length, target_length)
    data = random_batch(0, config.vocab_size, batch, source_length, target_length)
    compiled, compile_s = compile_timed(train_fn, state, data)
    params = count_parameters(state.params)
    seconds, _ = time_train_steps(compiled, state, data, iters, budget_s)
    flops = train_flops(config, batch, source_length, target_length)
    achieved = flops / seconds / 1e9
    row = dict(
        config=name,
        impl="jaxformer",
        batch=batch,
        src_len=source_length,
        tgt_len=target_length,
        params_M=params / 1e6,
        compile_s=compile_s,
        step_ms=seconds * 1e3,
        tokens_per_s=batch * target_length / seconds,
        model_gflop=flops / 1e9,
        xla_gflop=xla_flops(compiled) / 1e9,
        achieved_gflops=achieved,
    )
    return row, data


def bench_torch(name: str, config, data: dict, iters: int, budget_s: float) -> dict:
    from benchmarks import torch_reference as reference

    batch, source_length = data["inputs"].shape
    target_length = data["targets"].shape[1]
    model = reference.TorchTransformer(config, max_length=max(source_length, target_length))
    step = reference.make_train_step(model, config.d_model)
    source, targets = reference.as_tensor(data["inputs"]), reference.as_tensor(data["targets"])
    seconds = median(time_calls(lambda: step(source, targets), iters, budget_s))
    flops = train_flops(config, batch, source_length, target_length)
    achieved = flops / seconds / 1e9
    return dict(
        config=name,
        impl="torch",
        batch=batch,
        src_len=source_length,
        tgt_len=target_length,
        params_M=sum(p.numel() for p in model.parameters()) / 1e6,
        step_ms=seconds * 1e3,
        tokens_per_s=batch * target_length / seconds,
        model_gflop=flops / 1e9,
        achieved_gflops=achieved,
    )


def main(argv=None) -> list[dict]:
    arguments = parser(__doc__.splitlines()[0], budget_of="a row")
    arguments.add_argument("--configs", default="tiny,small,base", help="comma-separated: tiny, small, base")
    args = arguments.parse_args(argv)
    with_torch = check_torch(args)
    if args.smoke:
        setups = [("smoke", *SMOKE)]
        iters, peak_size = args.iters or 2, 256
    else:
        setups = [(name, *CONFIGS[name]()) for name in args.configs.split(",")]
        iters, peak_size = args.iters or 10, 2048
    peak_iters = 3 if args.smoke else 10
    rates_before = matmul_rates_gflops(peak_size, iters=peak_iters)
    rows = []
    for name, config, batch, source_length, target_length in setups:
        row, data = bench_jax(name, config, batch, source_length, target_length, iters, args.budget_s)
        rows.append(row)
        if with_torch:
            torch_row = bench_torch(name, config, data, iters, args.budget_s)
            row["jax_over_torch"] = row["tokens_per_s"] / torch_row["tokens_per_s"]
            rows.append(torch_row)
    rates_after = matmul_rates_gflops(peak_size, iters=peak_iters)
    before, after = median(rates_before), median(rates_after)
    peak, fastest = max(before, after), max(rates_before + rates_after)
    for row in rows:
        row["peak_gflops"] = peak
        row["mfu_pct"] = 100.0 * row["achieved_gflops"] / peak
        row["mfu_vs_fastest_pct"] = 100.0 * row["achieved_gflops"] / fastest
    title = (
        f"train step, peak f32 matmul {peak:,.0f} GFLOP/s ({peak_size}^2 XLA, median of {peak_iters} calls; "
        f"before the rows {before:,.0f}, after {after:,.0f}; fastest call {fastest:,.0f})"
    )
    if with_torch:
        title += f"; torch's f32 matmul {torch_matmul_peak_gflops(peak_size, iters=peak_iters):,.0f} GFLOP/s (median)"
    return report("train_step", rows, COLUMNS, args.json, title)


if __name__ == "__main__":
    main()
