"""The model config's memory options against each other: the compiled train step's memory and speed.

    python -m benchmarks.memory_options [--options plain,remat_full,...] [--layers 6] [--batch 32]
        [--length 128] [--iters 3] [--json FILE]

The `small` model with --layers encoder and decoder layers (default 6 + 6, where activations
outweigh the parameters), its train step on dense random rows of --length tokens each side,
compiled once per option (README: "Scaling out", the memory options). Memory is XLA's own
accounting of the compiled program (`compiled.memory_analysis()`): `temp_MB` holds the
activations kept for the backward pass; `temp_x` is the row's over `plain`'s. The step time is
the median of --iters steps, so a recomputation's cost shows beside the memory it saves. Each
option only changes how the same model is computed; on an accelerator the compiler plans memory
otherwise, so a row measured on one backend says nothing of another's.
"""

from __future__ import annotations

from benchmarks.command_line import names, parse_args, parser, report
from benchmarks.common import (
    SMOKE,
    compile_timed,
    make_train,
    memory_bytes,
    random_batch,
    small_config,
    time_train_steps,
)
from jaxformer.commands.common import at_least

# row -> the model config's values (README: "Scaling out", the memory options)
OPTIONS = {
    "plain": {},
    "remat_full": {"remat_policy": "full"},
    "remat_dots": {"remat_policy": "dots"},
    "remat_dots_no_batch": {"remat_policy": "dots_no_batch"},
    "scan": {"scan_layers": True},
    "scan_remat_full": {"scan_layers": True, "remat_policy": "full"},
    "scan_remat_dots": {"scan_layers": True, "remat_policy": "dots"},
    "scan_remat_dots_no_batch": {"scan_layers": True, "remat_policy": "dots_no_batch"},
    "bf16": {"dtype": "bfloat16"},
    "scan_bf16": {"scan_layers": True, "dtype": "bfloat16"},
    "matmul_bf16": {"matmul_dtype": "bfloat16"},
}
COLUMNS = ("option", "layers", "batch", "length", "compile_s", "step_ms", "args_MB", "temp_MB", "total_MB", "temp_x")
MB = 2.0**20


def main(argv=None) -> list[dict]:
    arguments = parser("memory_options", __doc__, budget_of="a row")
    arguments.add_argument(
        "--options",
        type=names(tuple(OPTIONS)),
        default=None,
        help=f"comma-separated rows, of {', '.join(OPTIONS)} (default all; plain first whatever the order)",
    )
    arguments.add_argument(
        "--layers", type=at_least(1), default=None, help="encoder and decoder layers each (default 6; not with --smoke)"
    )
    arguments.add_argument("--batch", type=at_least(1), default=None, help="rows (default 32; not with --smoke)")
    arguments.add_argument(
        "--length", type=at_least(1), default=None, help="tokens a side (default 128; not with --smoke)"
    )
    args = parse_args(arguments, argv, smoke_sets={"layers": 6, "batch": 32, "length": 128})
    chosen = args.options or list(OPTIONS)
    chosen = ["plain", *(name for name in chosen if name != "plain")]  # temp_x is against plain
    if args.smoke:
        model, args.batch, args.length, _ = SMOKE
        args.layers = model.num_encoder_layers
        iters = args.iters or 1
    else:
        model = small_config(num_encoder_layers=args.layers, num_decoder_layers=args.layers)
        iters = args.iters or 3
    data = random_batch(0, model, args.batch, args.length, args.length)
    rows = []
    for name in chosen:
        state, train_fn = make_train(model.replace(**OPTIONS[name]), args.length, args.length)
        compiled, compile_s = compile_timed(train_fn, state, data)
        memory = memory_bytes(compiled)
        seconds, _ = time_train_steps(compiled, state, data, iters, args.budget_s)
        rows.append(
            dict(
                option=name,
                layers=args.layers,
                batch=args.batch,
                length=args.length,
                compile_s=compile_s,
                step_ms=1e3 * seconds,
                args_MB=memory["argument"] / MB,
                temp_MB=memory["temp"] / MB,
                total_MB=memory["total"] / MB,
            )
        )
    for row in rows:
        row["temp_x"] = row["temp_MB"] / rows[0]["temp_MB"]
    title = f"memory options, d_model {model.d_model}, {args.layers} + {args.layers} layers"
    notes = ["  temp_x: the row's temp_MB over plain's (XLA's memory accounting of the compiled step)"]
    return report("memory_options", rows, COLUMNS, args.json, title, notes)


if __name__ == "__main__":
    main()
