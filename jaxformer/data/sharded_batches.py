"""A process's training batches: its input shards' pipelines read side by side into one
batch, checkpointed as one iterator."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np


class ShardedBatches:
    """This process's batches: the rows of its input shards' iterators, concatenated.

    The global batch is made of `input_shards` equal slices, one per shard pipeline, whatever
    the number of processes; a process reading shards 2k and 2k+1 yields the rows that two
    processes would. Checkpointable like a grain iterator (orbax's grain handler).

    A batch whose reading fails (a damaged record: DataError) is as if never begun: the state is
    then that of the batches yielded before it (a checkpoint saved then resumes with that batch,
    once the data is sound), and a next call reads it again from its start. Its shards' iterators
    have moved on (rows drawn, a packing round begun), so their own state would skip rows.
    """

    def __init__(self, iterators: Sequence):
        self.iterators = list(iterators)
        self._failed_batch_start: bytes | None = None  # the state before a batch that failed

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._failed_batch_start is not None:
            self.set_state(self._failed_batch_start)
        start = self.get_state()  # a few small dicts: microseconds a step
        try:
            batches = [next(iterator) for iterator in self.iterators]
        except Exception:
            self._failed_batch_start = start
            raise
        return {key: np.concatenate([batch[key] for batch in batches]) for key in batches[0]}

    def get_state(self) -> bytes:
        if self._failed_batch_start is not None:
            return self._failed_batch_start
        return json.dumps([iterator.get_state() for iterator in self.iterators]).encode()

    def set_state(self, state: bytes) -> None:
        states = json.loads(state.decode() if isinstance(state, bytes) else state)
        if len(states) != len(self.iterators):
            raise ValueError(f"data iterator state holds {len(states)} shards, this run reads {len(self.iterators)}")
        for iterator, shard_state in zip(self.iterators, states):
            iterator.set_state(shard_state)
        self._failed_batch_start = None

    def start_prefetch(self) -> None:
        for iterator in self.iterators:
            if hasattr(iterator, "start_prefetch"):
                iterator.start_prefetch()
