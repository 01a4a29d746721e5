"""How far bf16 compute moves a model's outputs from float32's: the largest logit and
log-probability differences, for one set of random weights.

    python -m benchmarks.precision [--configs tiny,multi30k] [--batches 4] [--json FILE]

Each config's model (a size of benchmarks/common.py, on its batch of dense random rows) is
initialised once, in float32, and run forward without dropout on --batches random batches as it
is, with `dtype=bfloat16` (bf16 compute: row `bf16`) and with `matmul_dtype=bfloat16` (float32
compute, bf16 operands for the weight products: `matmul_bf16`), README's "Scaling out" memory
options. `logit_diff` and `logprob_diff` are the largest absolute differences from float32's over
every position and vocabulary entry of those batches, the log-probabilities taken in float64 from
each run's float32 logits; `max_abs_logit` is float32's largest logit, the scale they move on.
Trained weights are sharper than initial ones, and another backend accumulates otherwise: the
figures hold for these weights on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
import scipy.special

from benchmarks.command_line import add_configs_flag, parse_args, report, summary
from benchmarks.common import CONFIGS, SMOKE, random_batch, random_params
from jaxformer.commands.common import Parser, at_least, path_text
from jaxformer.model.config import TransformerConfig
from jaxformer.model.transformer import Transformer

# row -> the model config's values (README: "Scaling out", the memory options)
OPTIONS = {"bf16": {"dtype": "bfloat16"}, "matmul_bf16": {"matmul_dtype": "bfloat16"}}
COLUMNS = ("config", "option", "batches", "rows", "length", "max_abs_logit", "logit_diff", "logprob_diff")
DEFAULT_CONFIGS = ("tiny", "multi30k")


def main(argv: Sequence[str] | None = None) -> list[dict]:
    arguments = Parser(prog="python -m benchmarks.precision", description=summary(__doc__))
    add_configs_flag(arguments, DEFAULT_CONFIGS)
    arguments.add_argument(
        "--batches", type=at_least(1), default=None, help="random batches compared (default 4; not with --smoke)"
    )
    arguments.add_argument(
        "--smoke", action="store_true", help="the tiny model on one batch of a few short rows: a check that it runs"
    )
    arguments.add_argument(
        "--json", metavar="FILE", type=path_text, help="also write the rows to FILE, one JSON object a line"
    )
    arguments.add_argument("--overwrite", action="store_true", help="with --json: replace FILE if it exists")
    args = parse_args(arguments, argv, smoke_sets={"configs": list(DEFAULT_CONFIGS), "batches": 4})
    sizes = {"tiny": SMOKE} if args.smoke else {name: CONFIGS[name]() for name in args.configs}
    batches = 1 if args.smoke else args.batches
    rows = []
    for name, (model, batch, source_length, target_length) in sizes.items():
        largest, differences = _differences(model, batch, source_length, target_length, batches)
        for option, (logit_diff, logprob_diff) in differences.items():
            rows.append(
                dict(
                    config=name,
                    option=option,
                    batches=batches,
                    rows=batch,
                    length=target_length,
                    max_abs_logit=largest,
                    logit_diff=logit_diff,
                    logprob_diff=logprob_diff,
                )
            )
    notes = [
        "  bf16: model.dtype=bfloat16; matmul_bf16: model.matmul_dtype=bfloat16 (float32 compute)",
        "  logit_diff, logprob_diff: the largest |difference| from float32's; max_abs_logit: float32's largest |logit|",
    ]
    return report("precision", rows, COLUMNS, args.json, "bf16 against float32, random weights", notes)


def _differences(
    model: TransformerConfig, batch: int, source_length: int, target_length: int, batches: int
) -> tuple[float, dict[str, tuple[float, float]]]:
    """(float32's largest |logit|, {option: (largest |logit difference|, largest |log-probability
    difference|)}) of `model`'s random weights over `batches` random batches."""
    model = model.replace(deterministic=True, dtype="float32", matmul_dtype=None)
    params = random_params(model)
    configs = {"float32": model, **{option: model.replace(**values) for option, values in OPTIONS.items()}}
    forward = {option: _forward(config) for option, config in configs.items()}
    largest, differences = 0.0, {option: (0.0, 0.0) for option in OPTIONS}
    for seed in range(batches):
        data = random_batch(seed, model, batch, source_length, target_length)
        logits = {
            option: np.asarray(run(params, data["inputs"], data["targets"]), np.float64)
            for option, run in forward.items()
        }
        exact = logits.pop("float32")
        exact_logprobs = scipy.special.log_softmax(exact, axis=-1)
        largest = max(largest, float(np.abs(exact).max()))
        for option, values in logits.items():
            logit_diff = float(np.abs(values - exact).max())
            logprob_diff = float(np.abs(scipy.special.log_softmax(values, axis=-1) - exact_logprobs).max())
            differences[option] = tuple(map(max, differences[option], (logit_diff, logprob_diff)))
    return largest, differences


def _forward(config: TransformerConfig):
    """`Transformer(config)`'s jitted logits of (params, source, target)."""
    model = Transformer(config)
    return jax.jit(lambda params, source, target: model.apply({"params": params}, source, target))


if __name__ == "__main__":
    main()
