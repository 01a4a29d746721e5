"""How train-step time, memory and compile time grow with sequence length.

    python -m benchmarks.scaling [--lengths 32,64,...,1024] [--tokens 4096 | --batch 8] [--iters 5] [--json FILE]

The `small` model's train step (source length = target length = L) on dense random rows. By
default every length sees the same number of target tokens per batch (batch = tokens / L), so
the matmuls of the projections and FFN stay constant and only attention (quadratic in L per
row, linear per token) grows; with --batch the batch is fixed and the work grows with L too.
Memory is XLA's own accounting of the compiled step (jit(...).lower(...).compile()
.memory_analysis()); compile_s is the lowering + compile time of each shape bucket.
"""

from __future__ import annotations

from benchmarks.command_line import parse_args, parser, positive_integers, report
from benchmarks.common import (
    SMOKE,
    compile_timed,
    make_train,
    memory_bytes,
    random_batch,
    small_config,
    time_train_steps,
    train_flops,
)
from jaxformer.commands.common import at_least

COLUMNS = (
    "length",
    "batch",
    "tokens",
    "compile_s",
    "step_ms",
    "tokens_per_s",
    "args_MB",
    "temp_MB",
    "total_MB",
    "model_gflop",
    "attention_pct",
    "predicted_ratio",
    "measured_ratio",
    "measured_over_predicted",
)
MB = 2.0**20


def attention_share(config, length: int) -> float:
    """Percentage of the model FLOPs spent in attention scores and weighted sums at length L."""
    d, n_enc, n_dec = config.d_model, config.num_encoder_layers, config.num_decoder_layers
    attention = n_enc * 4 * length * length * d + n_dec * 8 * length * length * d  # per row, forward
    return 100.0 * 3 * attention / train_flops(config, 1, length, length)


def main(argv=None) -> list[dict]:
    arguments = parser("scaling", __doc__, budget_of="a length")
    arguments.add_argument(
        "--lengths",
        type=positive_integers,
        default=None,
        help="comma-separated sequence lengths (default 32,64,128,256,512,1024; not with --smoke)",
    )
    sizing = arguments.add_mutually_exclusive_group()
    sizing.add_argument(
        "--tokens",
        type=at_least(1),
        default=None,
        help="target tokens per batch: batch = max(1, tokens // length) (default 4096; not with --smoke)",
    )
    sizing.add_argument("--batch", type=at_least(1), default=None, help="a fixed batch size instead of --tokens")
    # --tokens' default (4096) is set below: only without --batch.
    args = parse_args(arguments, argv, smoke_sets={"lengths": [32, 64, 128, 256, 512, 1024], "tokens": None})
    if args.smoke:
        config, lengths, args.tokens = SMOKE[0], [8, 16], 32
        iters = args.iters or 2
    else:
        config, lengths = small_config(), args.lengths
        if args.batch is None and args.tokens is None:
            args.tokens = 4096
        iters = args.iters or 5
    state, train_fn = make_train(config, 1, 1)
    rows = []
    for length in lengths:
        batch = args.batch if args.batch is not None else max(1, args.tokens // length)
        data = random_batch(length, config, batch, length, length)
        compiled, compile_s = compile_timed(train_fn, state, data)
        memory = memory_bytes(compiled)
        seconds, state = time_train_steps(compiled, state, data, iters, args.budget_s)
        rows.append(
            dict(
                length=length,
                batch=batch,
                tokens=batch * length,
                compile_s=compile_s,
                step_ms=1e3 * seconds,
                tokens_per_s=batch * length / seconds,
                args_MB=memory["argument"] / MB,
                temp_MB=memory["temp"] / MB,
                total_MB=memory["total"] / MB,
                model_gflop=train_flops(config, batch, length, length) / 1e9,
                attention_pct=attention_share(config, length),
            )
        )
    first = rows[0]
    for row in rows:
        row["predicted_ratio"] = row["model_gflop"] / first["model_gflop"]
        row["measured_ratio"] = row["step_ms"] / first["step_ms"]
        row["measured_over_predicted"] = row["measured_ratio"] / row["predicted_ratio"]
    batching = f"batch {args.batch}" if args.batch else f"{args.tokens} target tokens per batch"
    return report(
        "scaling", rows, COLUMNS, args.json, f"scaling with sequence length, d_model {config.d_model}, {batching}"
    )


if __name__ == "__main__":
    main()
