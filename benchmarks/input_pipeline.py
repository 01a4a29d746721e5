"""The training input pipeline streamed against encoded once, alone and beside the train step.

    python -m benchmarks.input_pipeline [--iters 6] [--steps 25] [--json FILE] [--smoke]

Both read Multi30k's training split (the vendored files, `multi30k`'s data section: 32 packed
rows of 64 tokens, 2 reader threads) through `jaxformer.data.pipeline.train_dataset`:
`streamed` decodes and sentencepiece-encodes each pair as an epoch draws it
(data.encode_once_max_examples=0, as before), `encoded_once` reads ids encoded before training
(`jaxformer/data/encoded_split.py`; the same batches). Two measures, each interleaved in this
run (rounds of one block of each pipeline, medians over the rounds):

- `batch_cpu_ms` / `batch_wall_ms`: the pipeline alone, per batch drawn (CPU: the process's,
  every thread's);
- `step_ms`: the loop train.py runs, per step: draw a batch, take `multi30k`'s train step on it
  (its model as the config gives it on this machine: `model.matmul_dtype=auto`) without waiting
  for the step (the pipeline's threads prefetch while XLA computes, on the same cores), `--steps`
  steps a block, blocked on at the block's end.
`speedup` is streamed's median over the row's. `encode_s` is the one-off encoding of the split.
"""

from __future__ import annotations

import time

import jax

from benchmarks.command_line import parse_args, parser, report
from benchmarks.common import median
from benchmarks.real_data import SOURCE, TARGET, cached_tokenizer, training_pairs
from benchmarks.step_options import compiled_step
from jaxformer.commands.common import at_least
from jaxformer.configs import multi30k
from jaxformer.data.pipeline import TokenizePair, train_dataset
from jaxformer.model.config import preset
from jaxformer.training.experiment import model_config

COLUMNS = ("pipeline", "pairs", "batch_cpu_ms", "batch_wall_ms", "step_ms", "steps_per_s", "speedup", "encode_s")
PIPELINES = {"streamed": 0, "encoded_once": None}  # name -> data.encode_once_max_examples (None: the config's)


def _pipelines(records, tokenizer, data) -> dict:
    iterators = {}
    for name, limit in PIPELINES.items():
        section = data.copy_and_resolve_references()
        if limit is not None:
            section.encode_once_max_examples = limit
        iterators[name] = iter(train_dataset(records, TokenizePair.for_data(section, tokenizer), section))
    return iterators


def _time_batches(iterator, count: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per batch over `count` batches."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        next(iterator)
    return 1e3 * (time.process_time() - cpu) / count, 1e3 * (time.perf_counter() - wall) / count


def main(argv=None) -> list[dict]:
    arguments = parser("input_pipeline", __doc__)
    arguments.add_argument(
        "--steps",
        type=at_least(1),
        default=None,
        help="batches (and train steps) per timed block (default 25; --smoke: 2)",
    )
    args = parse_args(arguments, argv)
    iters = args.iters or (1 if args.smoke else 6)
    steps = args.steps or (2 if args.smoke else 25)
    experiment = multi30k.get_config()
    data = experiment.data
    pairs = training_pairs()
    if args.smoke:
        pairs = pairs[:2000]
        data.batch_size, data.max_length, vocab_size = 4, 32, 300
    else:
        vocab_size = experiment.tokenizer.vocab_size
    tokenizer = cached_tokenizer(pairs, vocab_size)
    records = [{SOURCE: en, TARGET: de} for en, de in pairs]

    start = time.perf_counter()
    TokenizePair.for_data(data, tokenizer).encode_all(records)
    encode_s = time.perf_counter() - start
    iterators = _pipelines(records, tokenizer, data)
    for iterator in iterators.values():  # reader threads started, first epochs' buffers filled
        _time_batches(iterator, steps)
    alone = {name: [] for name in iterators}
    for _ in range(iters):
        for name, iterator in iterators.items():
            alone[name].append(_time_batches(iterator, steps))

    if args.smoke:
        model = preset("tiny", vocab_size=tokenizer.vocab_size)
    else:
        model = model_config(experiment, tokenizer.vocab_size)
    first = next(iterators["streamed"])
    length = data.max_length
    compiled = compiled_step(model, first, length, length, experiment.training.loss_chunk_tokens)
    state = compiled.state
    stepped = {name: [] for name in iterators}
    for round_index in range(iters + 1):  # the first round warms up
        for name, iterator in iterators.items():
            wall = time.perf_counter()
            for _ in range(steps):
                state, metrics = compiled.compiled(state, next(iterator))
            jax.block_until_ready(metrics)
            if round_index:
                stepped[name].append(1e3 * (time.perf_counter() - wall) / steps)

    baseline = median(stepped["streamed"])
    rows = []
    for name in iterators:
        step_ms = median(stepped[name])
        rows.append(
            dict(
                pipeline=name,
                pairs=len(records),
                batch_cpu_ms=median([cpu for cpu, _ in alone[name]]),
                batch_wall_ms=median([wall for _, wall in alone[name]]),
                step_ms=step_ms,
                steps_per_s=1e3 / step_ms,
                speedup=baseline / step_ms,
                encode_s=encode_s if name == "encoded_once" else None,
            )
        )
    title = (
        f"input pipeline: Multi30k {SOURCE}-{TARGET}, {len(records)} pairs, {data.batch_size} x {length} rows, "
        f"{tokenizer.vocab_size}-piece tokenizer, {data.num_threads} reader threads, {jax.local_device_count()} device"
    )
    notes = [
        f"  {iters} rounds of {steps} batches (and steps) per pipeline, interleaved; medians",
        f"  step_ms: {'the tiny model' if args.smoke else 'multi30k'}'s train step fed by the pipeline "
        f"(weight products' operands {model.matmul_operand_dtype.name})",
    ]
    return report("input_pipeline", rows, COLUMNS, args.json, title, notes)


if __name__ == "__main__":
    main()
