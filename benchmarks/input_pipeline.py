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
  without waiting for the step (the pipeline's threads prefetch while XLA computes, on the same
  cores), `--steps` steps a block, blocked on at the block's end. The step is the config's own,
  as the training loop builds it (`jaxformer/training/pace.py`'s `ConfigTrainStep`, on every
  device): its model as the config gives it on this machine (`model.matmul_dtype=auto`), its
  `training` and `optimizer` sections (R-Drop, AdamW's weight decay), and its vocabularies (one
  unigram tokenizer per language, trained on that side of the split as `train.py` trains it).
  `--smoke` takes that step at the `tiny` preset's sizes, in float32, on short rows.
`speedup` is streamed's median over the row's. `encode_s` is the one-off encoding of the split.
"""

from __future__ import annotations

import time

import jax

from benchmarks.command_line import parse_args, parser, report
from benchmarks.common import median
from benchmarks.real_data import SOURCE, TARGET, cached_tokenizer, training_pairs
from jaxformer.commands.common import at_least
from jaxformer.configs import multi30k
from jaxformer.data.pipeline import TokenizePair, train_dataset
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.model.config import PRESETS
from jaxformer.training import experiment as experiments
from jaxformer.training import sharding, text_sides
from jaxformer.training.pace import ConfigTrainStep

COLUMNS = ("pipeline", "pairs", "batch_cpu_ms", "batch_wall_ms", "step_ms", "steps_per_s", "speedup", "encode_s")
PIPELINES = {"streamed": 0, "encoded_once": None}  # name -> data.encode_once_max_examples (None: the config's)


# The model sizes --smoke takes from the `tiny` preset.
SMOKE_SIZES = ("d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers")


def smoke_config(config, device_count: int):
    """`config` at the smoke's sizes: the tiny preset's model in float32 (bf16 training of a model
    that small fails on XLA:CPU: benchmarks.step_options), 300 pieces a vocabulary, 32-token rows,
    4 rows a device; everything else (R-Drop, weight decay, separate vocabularies) as it is."""
    for key in SMOKE_SIZES:
        config.model[key] = PRESETS["tiny"][key]
    config.model.matmul_dtype = None
    config.tokenizer.vocab_size = 300
    config.data.batch_size, config.data.max_length = 4 * device_count, 32
    return config


def config_tokenizers(config, pairs: list[tuple[str, str]]) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers of `config` on `pairs`, as `train.py` trains them
    (jaxformer/training/run_tokenizer.py): one per language (tokenizer.separate_vocabularies),
    each on its side's text, or one on both; of the tokenizer section's size and kind."""
    section = config.tokenizer
    options = dict(
        model_type=section.model_type,
        character_coverage=section.character_coverage,
        max_sentences=section.max_sentences,
        control_symbols=tuple(text_sides.control_symbols(config)),
    )
    if not section.separate_vocabularies:
        shared = cached_tokenizer(pairs, section.vocab_size, (0, 1), **options)
        return shared, shared
    return tuple(cached_tokenizer(pairs, section.vocab_size, (side,), **options) for side in (0, 1))


def _pipelines(records, tokenizers, data) -> dict:
    iterators = {}
    for name, limit in PIPELINES.items():
        section = data.copy_and_resolve_references()
        if limit is not None:
            section.encode_once_max_examples = limit
        iterators[name] = iter(train_dataset(records, TokenizePair.for_data(section, *tokenizers), section))
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
    pairs = training_pairs()
    if args.smoke:
        pairs = pairs[:2000]
        smoke_config(experiment, jax.device_count())
    data = experiment.data
    # The step runs over every device, as train.py's: a batch they cannot split is refused now,
    # before the tokenizers train and the step compiles.
    rules = sharding.rules_from_config(experiment.mesh.logical_axis_rules)
    try:
        sharding.check_batch_size(data.batch_size, sharding.make_mesh(experiment.mesh.shape), rules)
    except sharding.MeshError as error:
        arguments.error(f"multi30k's {error} ({jax.device_count()} devices)")
    tokenizers = config_tokenizers(experiment, pairs)
    sizes = experiments.vocabulary_sizes(experiment)  # what the step is built for
    if sizes != tuple(tokenizer.vocab_size for tokenizer in tokenizers):
        raise RuntimeError(f"tokenizers of {[t.vocab_size for t in tokenizers]} pieces, the config's {sizes}")
    records = [{SOURCE: en, TARGET: de} for en, de in pairs]

    start = time.perf_counter()
    TokenizePair.for_data(data, *tokenizers).encode_all(records)
    encode_s = time.perf_counter() - start
    iterators = _pipelines(records, tokenizers, data)
    for iterator in iterators.values():  # reader threads started, first epochs' buffers filled
        _time_batches(iterator, steps)
    alone = {name: [] for name in iterators}
    for _ in range(iters):
        for name, iterator in iterators.items():
            alone[name].append(_time_batches(iterator, steps))

    train_step = ConfigTrainStep(experiment)  # lowered on random rows of the batches' shape
    train_step.compile()
    state, batch_sharding = train_step.state, sharding.batch_sharding(train_step.mesh, train_step.rules)
    stepped = {name: [] for name in iterators}
    for round_index in range(iters + 1):  # the first round warms up
        for name, iterator in iterators.items():
            wall = time.perf_counter()
            for _ in range(steps):  # as the training loop feeds its step
                state, metrics = train_step.compiled(state, sharding.global_batch(next(iterator), batch_sharding))
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
    source, target = tokenizers
    vocabularies = (
        f"{source.vocab_size}-piece {SOURCE} and {target.vocab_size}-piece {TARGET} tokenizers"
        if experiment.tokenizer.separate_vocabularies
        else f"one {source.vocab_size}-piece tokenizer"
    )
    title = (
        f"input pipeline: Multi30k {SOURCE}-{TARGET}, {len(records)} pairs, {data.batch_size} x {data.max_length} "
        f"rows, {vocabularies}, {data.num_threads} reader threads, {jax.device_count()} device(s)"
    )
    model = experiments.model_config(
        experiment, sizes[1], sizes[0] if experiment.tokenizer.separate_vocabularies else None
    )
    training, optimizer = experiment.training, experiment.optimizer
    notes = [
        f"  {iters} rounds of {steps} batches (and steps) per pipeline, interleaved; medians",
        f"  step_ms: multi30k's train step{' at the tiny preset sizes' if args.smoke else ''} fed by the pipeline: "
        f"R-Drop alpha {training.rdrop_alpha}, weight decay {optimizer.weight_decay}, label smoothing "
        f"{training.label_smoothing}, loss chunks of {training.loss_chunk_tokens} tokens, dropout "
        f"{model.dropout_rate}, weight products' operands {model.matmul_operand_dtype.name}",
    ]
    return report("input_pipeline", rows, COLUMNS, args.json, title, notes)


if __name__ == "__main__":
    main()
