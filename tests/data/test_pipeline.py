import logging

import numpy as np
import pytest

from jaxformer.data import pipeline
from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import LengthFilter, TokenizePair, eval_batches, read_records, train_dataset
from jaxformer.data.sharded_batches import ShardedBatches
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.training.experiment import default_config

WORDS = "a man woman child dog runs sits red blue big small the in on with".split()
WÖRTER = "ein mann frau kind hund rennt sitzt rot blau groß klein der im auf mit".split()
MAX_LENGTH = 40


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    records, seen = [], set()
    while len(records) < 300:
        length = int(rng.integers(1, 12))
        picks = tuple(rng.integers(0, len(WORDS), length))
        if picks in seen:  # distinct pairs, so a pair's content identifies it
            continue
        seen.add(picks)
        records.append(
            {"en": " ".join(WORDS[i] for i in picks).encode(), "de": " ".join(WÖRTER[i] for i in picks).encode()}
        )
    records.append({"en": " ".join(["dog"] * 40).encode(), "de": b"hund"})  # too long: dropped
    tokenizer = train_tokenizer([r[k].decode() for r in records for k in ("en", "de")], vocab_size=50)
    return records, tokenizer


def kept_pairs(corpus, max_length=MAX_LENGTH):
    """Every (source ids, target ids) pair that fits, in corpus order."""
    records, tokenizer = corpus
    pairs = [(tuple(tokenizer.encode(r["en"].decode())), tuple(tokenizer.encode(r["de"].decode()))) for r in records]
    return [pair for pair in pairs if max(map(len, pair)) <= max_length]


def ids(count):
    """`count` ids of a piece (5), not EOS: a side that the length filter judges by its length alone."""
    return np.full(count, 5)


def data_section(**overrides):
    """The experiment's data section as these tests use it, with `overrides`."""
    data = default_config().data
    data.update(dict(max_length=MAX_LENGTH, batch_size=4, eval_batch_size=4, shuffle_seed=7, num_threads=0))
    data.update(overrides)
    return data


def make(corpus, length_filter=None, shard_index=0, shard_count=1, **overrides):
    records, tokenizer = corpus
    data = data_section(**overrides)
    return train_dataset(
        records,
        TokenizePair.for_data(data, tokenizer),
        data,
        length_filter=length_filter,
        shard_index=shard_index,
        shard_count=shard_count,
    )


def unpack(batch):
    """(source ids, target ids) of every packed pair in a batch."""
    pairs = []
    for row in range(batch["inputs"].shape[0]):
        for segment in range(1, batch["inputs_segment_ids"][row].max() + 1):
            source = batch["inputs"][row][batch["inputs_segment_ids"][row] == segment]
            target = batch["targets"][row][batch["targets_segment_ids"][row] == segment]
            pairs.append((tuple(source), tuple(target)))
    return pairs


def test_batches_have_fixed_shapes_and_consistent_packing(corpus):
    iterator = iter(make(corpus))
    expected = set(kept_pairs(corpus))
    for _ in range(5):
        batch = next(iterator)
        assert {key: value.shape for key, value in batch.items()} == {
            key: (4, MAX_LENGTH)
            for key in (
                "inputs",
                "targets",
                "inputs_segment_ids",
                "targets_segment_ids",
                "inputs_positions",
                "targets_positions",
            )
        }
        assert all(value.dtype == np.int32 for value in batch.values())
        # Padding has segment 0; positions restart at 0 in each segment.
        assert ((batch["inputs"] == 0) == (batch["inputs_segment_ids"] == 0)).all()
        for row in range(4):
            segments, positions = batch["targets_segment_ids"][row], batch["targets_positions"][row]
            for segment in range(1, segments.max() + 1):
                np.testing.assert_array_equal(positions[segments == segment], np.arange((segments == segment).sum()))
        # Each packed segment is one real pair of the corpus, source and target together.
        assert set(unpack(batch)) <= expected


def test_order_is_seeded_and_reshuffled_per_epoch(corpus):
    def first_pairs(seed, n=12):
        iterator = iter(make(corpus, shuffle_seed=seed))
        return [pair for _ in range(n) for pair in unpack(next(iterator))]

    assert first_pairs(7) == first_pairs(7)
    assert first_pairs(7) != first_pairs(8)
    # 120 batches reach well past one epoch: every kept pair shows up.
    distinct = set(kept_pairs(corpus))
    assert len(distinct) > 250
    iterator = iter(make(corpus))
    seen = [pair for _ in range(120) for pair in unpack(next(iterator))]
    assert set(seen) == distinct


def test_iterator_state_restores_exactly(corpus):
    iterator = iter(make(corpus))
    for _ in range(7):
        next(iterator)
    state = iterator.get_state()
    expected = [next(iterator) for _ in range(5)]
    fresh = iter(make(corpus))
    fresh.set_state(state)
    for want in expected:
        got = next(fresh)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_length_filter_counts_drops(corpus):
    length_filter = LengthFilter(3)
    examples = [{"inputs": ids(a), "targets": ids(b)} for a, b in [(3, 3), (4, 1), (1, 4), (2, 2)]]
    assert [length_filter(example) for example in examples] == [True, False, False, True]
    assert (length_filter.seen, length_filter.dropped) == (4, 2)

    records, _ = corpus
    overlong = len(records) - len(kept_pairs(corpus))
    length_filter = LengthFilter(MAX_LENGTH)
    iterator = iter(make(corpus, length_filter=length_filter))
    while length_filter.seen < len(records):  # one whole epoch read
        next(iterator)
    assert overlong >= 1 and length_filter.dropped >= overlong


def test_the_training_log_says_what_the_length_filter_counted():
    """The validation line's counts are of the training pairs the run read: since it started, or
    since it resumed; nothing before any was read (a fine-tuning run's step 0)."""
    length_filter = LengthFilter(3)
    assert length_filter.dropped_since(0) == ""
    for example in [{"inputs": ids(a), "targets": ids(1)} for a in range(1, 1502)]:
        length_filter(example)
    assert length_filter.dropped_since(0) == (
        "; the length filter dropped 1,498 of the 1,501 training pairs read since the run started"
    )
    assert length_filter.dropped_since(34).endswith("1,501 training pairs read since it resumed at step 34")


def test_the_training_log_counts_every_process():
    """With several processes each reads its own shard: the line gives the run's sums, from a
    collective that every process calls, also one that has read nothing yet (or the others wait)."""
    from jaxformer.training import processes

    length_filter, calls = LengthFilter(3), []

    def summed(counts):  # as if a second process had read as much again
        calls.append(counts)
        return tuple(2 * count for count in counts)

    assert length_filter.dropped_since(0, summed) == "" and calls == [(0, 0, 0)]
    for example in [{"inputs": ids(a), "targets": ids(1)} for a in range(1, 6)]:
        length_filter(example)
    assert length_filter.dropped_since(7, summed) == (
        "; the length filter dropped 4 of the 10 training pairs read since it resumed at step 7"
    )
    assert processes.summed_over_processes((5, 2)) == (5, 2)  # one process: its own


@pytest.mark.parametrize("encode_once", [True, False])
def test_a_split_where_nothing_fits_is_an_error_not_an_endless_wait(corpus, encode_once):
    records, tokenizer = corpus
    shortest = min(max(map(len, pair)) for pair in kept_pairs(corpus))
    overrides = dict(max_length=shortest - 1, encode_once_max_examples=1_000_000 if encode_once else 0)
    if encode_once:  # found while the split is encoded, before anything else
        with pytest.raises(DataError, match=f"training: none of the {len(records)} examples fits data.max_length="):
            make(corpus, **overrides)
    else:  # a stream: once a few epochs' worth of examples in a row were all too long
        iterator = iter(make(corpus, **overrides))
        with pytest.raises(DataError, match=f"no training pair fits data.max_length={shortest - 1} tokens a side"):
            next(iterator)
    with pytest.raises(DataError, match=f"validation: none of the {len(records)} examples fits data.max_length="):
        eval_batches(records, TokenizePair.for_data(data_section(), tokenizer), data_section(max_length=shortest - 1))


def test_one_example_that_fits_is_enough(corpus):
    """The streaming filter's patience: a split where a single example fits still yields batches."""
    records, tokenizer = corpus
    lengths = [max(len(tokenizer.encode(r["en"].decode())), len(tokenizer.encode(r["de"].decode()))) for r in records]
    shortest = min(lengths)
    only_one = [r for r, n in zip(records, lengths) if n > shortest] + [records[lengths.index(shortest)]]
    data = data_section(max_length=shortest, encode_once_max_examples=0)
    iterator = iter(train_dataset(only_one, TokenizePair.for_data(data, tokenizer), data))
    for _ in range(3):
        batch = next(iterator)
        assert (batch["inputs_segment_ids"].max(axis=1) == 1).all()  # one copy of that example a row


def test_process_shards_are_disjoint(corpus):
    shards = []
    for index in range(2):
        iterator = iter(make(corpus, shard_index=index, shard_count=2))
        shards.append({pair for _ in range(40) for pair in unpack(next(iterator))})
    assert shards[0] and shards[1] and not (shards[0] & shards[1])


def test_eval_batches_cover_every_pair_once(corpus):
    records, tokenizer = corpus
    data = data_section()
    batches = eval_batches(records, TokenizePair.for_data(data, tokenizer), data)
    assert all(batch["inputs"].shape == (4, MAX_LENGTH) for batch in batches)
    pairs = [pair for batch in batches for pair in unpack(batch)]
    assert sorted(pairs) == sorted(kept_pairs(corpus))  # every pair that fits, once


class BatchedSource:
    """A list read as tfds's array_record sources are, one record or a batch (`__getitems__`) at
    a time; it keeps the batches asked for."""

    def __init__(self, records):
        self.records, self.batches = records, []

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        return self.records[index]

    def __getitems__(self, keys):
        self.batches.append(list(keys))
        return [self.records[key] for key in keys]


def test_records_are_read_in_order_in_batches_where_the_source_reads_batches(monkeypatch):
    monkeypatch.setattr(pipeline, "READ_CHUNK", 7)
    source = BatchedSource([f"record {index}" for index in range(30)])
    assert list(read_records(source, range(1, 30, 2))) == [f"record {index}" for index in range(1, 30, 2)]
    assert source.batches == [[1, 3, 5, 7, 9, 11, 13], [15, 17, 19, 21, 23, 25, 27], [29]]
    assert list(read_records(source)) == source.records
    assert list(read_records(source.records, [5, 3])) == ["record 5", "record 3"]  # one at a time


@pytest.mark.parametrize("shard_index, shard_count", [(0, 1), (1, 2)])
def test_encoding_once_gives_the_streamed_batches_and_states(corpus, shard_index, shard_count):
    """A shard small enough to encode up front (read in batches) yields the batches, in the order,
    and the iterator states of encoding each record as it is drawn; either one's state restores
    the other, so a run resumed across the change continues exactly."""
    records, tokenizer = corpus
    batched = BatchedSource(records)
    once = iter(make((batched, tokenizer), shard_index=shard_index, shard_count=shard_count))
    assert sum(map(len, batched.batches)) == len(records) // shard_count  # the shard, read in batches
    streamed = iter(make(corpus, shard_index=shard_index, shard_count=shard_count, encode_once_max_examples=0))
    for _ in range(25):  # past the end of the first epoch (300 pairs, about 8 a batch)
        want, got = next(streamed), next(once)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
        assert once.get_state() == streamed.get_state()
    state = streamed.get_state()
    resumed = iter(make(corpus, shard_index=shard_index, shard_count=shard_count))
    resumed.set_state(state)
    want, got = next(streamed), next(resumed)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_encode_once_holds_every_record_as_the_tokenizer_encodes_it(corpus):
    records, tokenizer = corpus
    split = TokenizePair.for_data(data_section(), tokenizer).encode_all(records)
    assert len(split) == len(records)
    for index in (0, 17, len(records) - 1, -1):
        record = records[index]
        np.testing.assert_array_equal(split[index]["inputs"], tokenizer.encode(record["en"].decode()))
        np.testing.assert_array_equal(split[index]["targets"], tokenizer.encode(record["de"].decode()))
        assert split[index]["inputs"].dtype == np.int32 and not split[index]["inputs"].flags.writeable
    tokens = sum(len(tokenizer.encode(r[k].decode())) for r in records for k in ("en", "de"))
    assert split.nbytes == 4 * tokens + 2 * 8 * (len(records) + 1)
    with pytest.raises(IndexError):
        split[len(records)]


def test_pairs_left_out_to_make_equal_shards_are_counted_in_the_log(corpus, caplog):
    records, tokenizer = corpus
    odd = records[: (len(records) - 2) // 3 * 3 + 2]  # two more than three equal shards hold
    with caplog.at_level(logging.INFO):
        make((odd, tokenizer), shard_index=0, shard_count=3)
        make((odd, tokenizer), shard_index=1, shard_count=3)  # said once, by shard 0
    said = [message for message in caplog.messages if message.startswith("training pairs: the last")]
    assert said == [
        f"training pairs: the last 2 of {len(odd)} are not read, so that 3 input shards hold {len(odd) // 3} each"
    ]


class DamagedSource:
    """`records`, read one at a time; once `sound_reads` is set, the reads after that many raise
    DataError, as a prepared file damaged while a run trains does (`ReadableSplit`)."""

    def __init__(self, records):
        self.records, self.reads, self.sound_reads = records, 0, None

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        self.reads += 1
        if self.sound_reads is not None and self.reads > self.sound_reads:
            raise DataError("the prepared data is damaged")
        return self.records[index]


def test_a_batch_that_cannot_be_read_leaves_the_state_of_the_batches_before_it(corpus):
    """Whichever record fails (in the first shard, or in the second once the first has its rows),
    the state is that of the batches yielded: restored (a checkpoint saved then), it yields the
    failed batch and those after it as a pipeline never damaged; read again once the data is
    sound, the failed batch comes whole."""
    records, tokenizer = corpus

    def sharded(source):  # two input shards, each read as its records are drawn
        return ShardedBatches(
            [iter(make((source, tokenizer), shard_index=i, shard_count=2, encode_once_max_examples=0)) for i in (0, 1)]
        )

    sound = sharded(records)
    expected = [next(sound) for _ in range(5)]
    counting = DamagedSource(records)
    counted = sharded(counting)
    for _ in range(3):
        next(counted)
    reads_before = counting.reads
    next(counted)
    reads_of_batch_4 = counting.reads - reads_before
    assert reads_of_batch_4 > 4  # both shards read for it
    for failing_read in range(1, reads_of_batch_4 + 1):
        source = DamagedSource(records)
        damaged = sharded(source)
        for _ in range(3):
            next(damaged)
        before = damaged.get_state()
        source.sound_reads = source.reads + failing_read - 1
        with pytest.raises(DataError):
            next(damaged)
        assert damaged.get_state() == before, f"failing at read {failing_read} of the batch"
        restored = sharded(records)
        restored.set_state(damaged.get_state())
        source.sound_reads = None  # the data prepared again
        for want in expected[3:]:
            for iterator in (restored, damaged):
                got = next(iterator)
                for key in want:
                    np.testing.assert_array_equal(got[key], want[key])
