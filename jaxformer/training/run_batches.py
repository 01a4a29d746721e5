"""The batches a training run reads: its endless training stream, one iterator per input shard
this process reads (`run_start.input_shards`), through the length filter whose counts the
validation lines give; and its validation batches, as its objective scores them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import ml_collections

from jaxformer.data.pipeline import LengthFilter, TokenizePair, eval_batches, train_dataset
from jaxformer.data.sharded_batches import ShardedBatches
from jaxformer.data.subword_sampling import SubwordSampling
from jaxformer.training import run_start, text_sides
from jaxformer.training.run_start import PreparedRun


@dataclasses.dataclass(frozen=True)
class RunBatches:
    train: ShardedBatches  # restored with the checkpoint, saved with each
    evaluation: Iterable[Any]  # read whole at each evaluation
    length_filter: LengthFilter  # the training stream's


def run_batches(config: ml_collections.ConfigDict, prepared: PreparedRun, objective) -> RunBatches:
    """The training and validation batches of `prepared`'s data, tokenized for `objective`."""
    data, tokenizers = config.data, prepared.tokenizers
    length_filter = LengthFilter(data.max_length, text_sides.example_noun(config))
    shard_count, my_shards = run_start.input_shards(data)
    sampling = SubwordSampling.from_config(config.tokenizer)
    tokenize = TokenizePair.for_data(data, tokenizers.source, tokenizers.target, objective.features, sampling)
    train = ShardedBatches(
        [
            iter(
                train_dataset(
                    prepared.train_source,
                    tokenize,
                    data,
                    length_filter=length_filter,
                    shard_index=shard,
                    shard_count=shard_count,
                )
            )
            for shard in my_shards
        ]
    )
    examples = text_sides.example_noun(config)
    batches = eval_batches(prepared.eval_source, tokenize, data, examples, data.eval_split)
    evaluation = objective.evaluation_batches(
        batches, evaluation_remedy(data.max_eval_examples, len(prepared.eval_source))
    )
    return RunBatches(train, evaluation, length_filter)


def evaluation_remedy(max_eval_examples: int | None, split_size: int) -> str:
    """How to evaluate more examples than the `split_size` split's first `max_eval_examples`
    (None: all): raise that limit, or, where it reads the whole split already, give it more text."""
    if max_eval_examples is not None and max_eval_examples < split_size:
        return f"evaluate more of them (data.max_eval_examples={max_eval_examples} of the split's {split_size:,})"
    return f"the validation split holds no more ({split_size:,}, all evaluated): give it more text"
