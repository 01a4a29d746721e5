"""Real-data training throughput: non-padding target tokens per second on a slice of Multi30k.

    python -m benchmarks.real_data [--pairs 4096] [--repeats 3] [--torch] [--json FILE]

jaxformer reads the slice through its own input pipeline (jaxformer.data.pipeline.train_dataset:
tokenize, length filter, pack pairs into fixed [B, L] rows) and trains the `small` model with
its own jitted train step. With --torch, the PyTorch reference trains on the same sentence pairs
in batches padded to their longest sentence (as a PyTorch user writes), with as many pairs per
batch as jaxformer's packed batches hold on average. Batches are made before timing; the
pipeline's own time is reported apart (pipeline_s).
"""

from __future__ import annotations

import hashlib
import pathlib
import tempfile
import time

import jax
import numpy as np

import jaxformer.data
from benchmarks.command_line import check_torch, parse_args, parser, report
from benchmarks.common import compile_timed, make_train, median, small_config
from jaxformer.commands.common import FlagError, at_least
from jaxformer.data.parallel_text import read_parallel_lines
from jaxformer.data.pipeline import LengthFilter, TokenizePair, train_dataset
from jaxformer.data.tokenizer import Tokenizer, train_tokenizer
from jaxformer.errors import UserError
from jaxformer.model.config import preset
from jaxformer.tokens import PAD_ID
from jaxformer.training.experiment import default_config

RAW = pathlib.Path(jaxformer.data.__file__).parent / "raw" / "multi30k"
SOURCE, TARGET = "en", "de"
COLUMNS = (
    "impl",
    "batching",
    "steps",
    "rows",
    "pairs_per_step",
    "pairs",
    "target_tokens",
    "pad_pct",
    "pipeline_s",
    "compile_s",
    "step_ms",
    "tokens_per_s",
    "pairs_per_s",
    "jax_over_torch",
)


def training_pairs() -> list[tuple[str, str]]:
    """The (English, German) pairs of Multi30k's training split, from the vendored files."""
    return [(en, de) for _, en, de in read_parallel_lines(RAW / "train.en.gz", RAW / "train.de.gz")]


def cached_tokenizer(
    pairs: list[tuple[str, str]], vocab_size: int, sides: tuple[int, ...] = (0, 1), **options
) -> Tokenizer:
    """A tokenizer trained on the `sides` of `pairs` (0: English, 1: German; default both), with
    train_tokenizer's `options` (model_type, ...), cached in the temp dir across runs."""
    key = f"{len(pairs)}|{pairs[0]}|{pairs[-1]}|{vocab_size}|{sides}|{sorted(options.items())}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    path = pathlib.Path(tempfile.gettempdir()) / f"jaxformer-bench-tokenizer-{vocab_size}-{digest}.model"
    if path.exists():
        return Tokenizer.load(path)
    tokenizer = train_tokenizer([pair[side] for pair in pairs for side in sides], vocab_size, **options)
    tokenizer.save(path)
    return tokenizer


def packed_batches(
    records: list[dict], tokenizer: Tokenizer, max_length: int, batch_size: int
) -> tuple[list[dict], float]:
    """About one epoch of `records` from the project's pipeline (packed batches), and the seconds it took."""
    wanted = sum(
        len(tokenizer.encode(r[SOURCE])) <= max_length and len(tokenizer.encode(r[TARGET])) <= max_length
        for r in records
    )
    if not wanted:
        raise FlagError(f"argument --max-length: no pair of the slice has both sides within {max_length} tokens")
    data = default_config().data
    data.update(
        dict(
            source_language=SOURCE,
            target_language=TARGET,
            max_length=max_length,
            batch_size=batch_size,
            shuffle_seed=0,
            num_threads=1,
        )
    )
    start = time.perf_counter()
    tokenize = TokenizePair.for_data(data, tokenizer)
    iterator = iter(train_dataset(records, tokenize, data, length_filter=LengthFilter(max_length)))
    batches, pairs = [], 0
    while pairs < wanted:
        batch = next(iterator)
        batches.append(batch)
        pairs += int(batch["targets_segment_ids"].max(axis=1).sum())
    if len(batches) < 2:  # the epoch fills less than a batch: the packed rows would repeat its pairs
        raise FlagError(
            f"argument --pairs: {wanted} pairs of the slice have both sides within {max_length} tokens, fewer "
            f"than one packed batch of {batch_size} rows holds ({pairs}); raise --pairs or --max-length, "
            "or lower --batch-size"
        )
    return batches, time.perf_counter() - start


def padded_batches(records: list[dict], tokenizer: Tokenizer, max_length: int, pairs_per_batch: int) -> list[dict]:
    """The same pairs, shuffled, in batches of `pairs_per_batch` padded to each batch's longest side."""
    pairs = [(tokenizer.encode(r[SOURCE]), tokenizer.encode(r[TARGET])) for r in records]
    pairs = [pair for pair in pairs if len(pair[0]) <= max_length and len(pair[1]) <= max_length]
    order = np.random.default_rng(0).permutation(len(pairs))
    batches = []
    for start in range(0, len(order), pairs_per_batch):
        chunk = [pairs[i] for i in order[start : start + pairs_per_batch]]
        batch = {}
        for key, side in (("inputs", 0), ("targets", 1)):
            width = max(len(pair[side]) for pair in chunk)
            rows = np.full((len(chunk), width), PAD_ID, np.int32)
            for row, pair in zip(rows, chunk):
                row[: len(pair[side])] = pair[side]
            batch[key] = rows
        batches.append(batch)
    return batches


def _stats(batches: list[dict]) -> dict:
    slots = sum(b["targets"].size for b in batches)
    tokens = sum(int((b["targets"] != PAD_ID).sum()) for b in batches)
    if "targets_segment_ids" in batches[0]:
        pairs = sum(int(b["targets_segment_ids"].max(axis=1).sum()) for b in batches)
    else:
        pairs = sum(b["targets"].shape[0] for b in batches)
    return dict(steps=len(batches), pairs=pairs, target_tokens=tokens, pad_pct=100.0 * (slots - tokens) / slots)


def bench_jax(config, batches: list[dict], max_length: int, repeats: int) -> dict:
    state, train_fn = make_train(config, max_length, max_length)
    compiled, compile_s = compile_timed(train_fn, state, batches[0])
    state, metrics = compiled(state, batches[0])  # warm up
    jax.block_until_ready(metrics)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        passes.append(time.perf_counter() - start)
    return dict(seconds=median(passes), compile_s=compile_s)


def bench_torch(config, batches: list[dict], repeats: int) -> dict:
    from benchmarks import torch_reference as reference

    length = max(max(b["inputs"].shape[1], b["targets"].shape[1]) for b in batches)
    model = reference.TorchTransformer(config, max_length=length)
    step = reference.make_train_step(model, config.d_model)
    tensors = [(reference.as_tensor(b["inputs"]), reference.as_tensor(b["targets"])) for b in batches]
    step(*tensors[0])  # warm up
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for source, targets in tensors:
            step(source, targets)
        passes.append(time.perf_counter() - start)
    return dict(seconds=median(passes))


def main(argv=None) -> list[dict]:
    arguments = parser("real_data", __doc__, torch=True)
    arguments.add_argument(
        "--pairs",
        type=at_least(1),
        default=None,
        help="training pairs in the slice, the first ones (default 4096; not with --smoke)",
    )
    arguments.add_argument(
        "--batch-size",
        type=at_least(1),
        default=None,
        help="packed rows per jaxformer batch (default 32; not with --smoke)",
    )
    arguments.add_argument(
        "--max-length",
        type=at_least(1),
        default=None,
        help="row length / longest sentence kept, in tokens (default 64; not with --smoke)",
    )
    arguments.add_argument(
        "--vocab-size",
        type=at_least(1),
        default=None,
        help="tokenizer pieces, one vocabulary shared by both languages (default 8000; not with --smoke). "
        "jaxformer/configs/multi30k.py has 6000 per language, separate vocabularies",
    )
    arguments.add_argument(
        "--repeats",
        type=at_least(1),
        default=None,
        help="timed passes over the slice (default 3; --smoke: 1); --iters is another name for it",
    )
    smoke_sets = {"pairs": 4096, "batch_size": 32, "max_length": 64, "vocab_size": 8000}
    args = parse_args(arguments, argv, smoke_sets)
    if args.smoke:
        args.pairs, args.batch_size, args.max_length, args.vocab_size = 48, 4, 32, 300
    if args.repeats is not None and args.iters is not None:
        arguments.error("argument --repeats: not allowed with argument --iters (both set the timed passes)")
    repeats = args.repeats or args.iters or (1 if args.smoke else 3)

    pairs = training_pairs()
    if args.pairs > len(pairs):
        arguments.error(f"argument --pairs: {args.pairs} is more than the {len(pairs):,} training pairs")
    try:
        tokenizer = cached_tokenizer(pairs[:2000] if args.smoke else pairs, args.vocab_size)
    except UserError as error:  # a vocabulary the sentences cannot fill, or too small for their characters
        arguments.error(f"argument --vocab-size: {error}")
    if args.smoke:
        config = preset("tiny", vocab_size=tokenizer.vocab_size)
    else:
        config = small_config(vocab_size=tokenizer.vocab_size)
    records = [{SOURCE: en, TARGET: de} for en, de in pairs[: args.pairs]]

    try:
        batches, pipeline_s = packed_batches(records, tokenizer, args.max_length, args.batch_size)
    except FlagError as error:
        arguments.error(str(error))
    with_torch = check_torch(args)  # after the flags' checks: a bad flag is one line, without torch's note
    stats = _stats(batches)
    timing = bench_jax(config, batches, args.max_length, repeats)
    seconds = timing["seconds"]
    rows = [
        dict(
            impl="jaxformer",
            batching="packed",
            rows=args.batch_size,
            pairs_per_step=stats["pairs"] / stats["steps"],
            **stats,
            pipeline_s=pipeline_s,
            compile_s=timing["compile_s"],
            step_ms=1e3 * seconds / stats["steps"],
            tokens_per_s=stats["target_tokens"] / seconds,
            pairs_per_s=stats["pairs"] / seconds,
        )
    ]
    if with_torch:
        per_batch = max(1, round(stats["pairs"] / stats["steps"]))
        torch_batches = padded_batches(records, tokenizer, args.max_length, per_batch)
        torch_stats = _stats(torch_batches)
        seconds = bench_torch(config, torch_batches, repeats)["seconds"]
        rows.append(
            dict(
                impl="torch",
                batching="padded",
                rows=per_batch,
                pairs_per_step=torch_stats["pairs"] / torch_stats["steps"],
                **torch_stats,
                step_ms=1e3 * seconds / torch_stats["steps"],
                tokens_per_s=torch_stats["target_tokens"] / seconds,
                pairs_per_s=torch_stats["pairs"] / seconds,
            )
        )
        rows[0]["jax_over_torch"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    title = (
        f"real data: {args.pairs} Multi30k {SOURCE}-{TARGET} pairs, {tokenizer.vocab_size}-piece tokenizer, "
        f"max length {args.max_length}"
    )
    return report("real_data", rows, COLUMNS, args.json, title)


if __name__ == "__main__":
    main()
