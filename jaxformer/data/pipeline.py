"""The grain input pipeline: random-access source -> seeded per-epoch shuffle -> tokenize ->
length filter -> pack pairs into rows -> batches of fixed shape [B, L].

Packing puts several pairs in one row with segment ids (1, 2, ... per pair, 0 at padding)
and per-pair positions, so every batch has the same shape and jit compiles once; the model
keeps the pairs apart through its segment masks. The training iterator's state
(`get_state` / `set_state`) is checkpointed with the model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

import grain
import ml_collections
import numpy as np

from jaxformer.data.encoded_split import EncodedSplit
from jaxformer.data.example_words import ExampleWords, example_words
from jaxformer.data.parallel_text import DataError, skipped_pairs_text
from jaxformer.data.subword_sampling import SubwordSampling
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.tokens import has_pieces, has_visible_text

logger = logging.getLogger(__name__)

FEATURES = ("inputs", "targets")


def record_text(record, language: str) -> str:
    """One side of a tfds record as text: prepared datasets give bytes, tfds's mock data str."""
    value = record[language]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def visible_text_or_empty(record, language: str) -> str:
    """`record_text`, or "" where it holds no visible character (`has_visible_text`), which encodes
    to EOS alone: training and the validation loss leave such a pair out as one whose side encodes
    to no piece, as evaluate and translate read such a side as empty. The tokenizer keeps some of
    those characters (a zero-width joiner, a soft hyphen, NUL) as an unknown piece: trained on it,
    the model would learn to translate nothing into something."""
    text = record_text(record, language)
    return text if has_visible_text(text) else ""


READ_CHUNK = 4096  # records per batched read


def read_records(source: Sequence, indices: Sequence[int] | None = None) -> Iterator:
    """`source`'s records at `indices` (default: all of them), in order. Sources that read
    batches (`__getitems__`: tfds's array_record sources) are read 4,096 records at a time: one
    random access per record took 5.0 s for Multi30k's 29,000 training pairs through grain
    against 0.8 s in batches."""
    indices = range(len(source)) if indices is None else indices
    batched = getattr(source, "__getitems__", None)
    for start in range(0, len(indices), READ_CHUNK):
        chunk = [int(index) for index in indices[start : start + READ_CHUNK]]
        yield from batched(chunk) if batched else (source[key] for key in chunk)


class TokenizePair:
    """{source_language: bytes, target_language: bytes} -> {"inputs": ids, "targets": ids}: int32, EOS-terminated.

    `tokenizer` encodes both sides, or the source side only when a `target_tokenizer` is given
    (separate vocabularies). `features` names the sides to keep: a language model reads one
    ("inputs", the source language's text, for a masked LM; "targets" for a causal LM).
    With `sampling`, the training pipeline encodes through `sample` instead, one drawn
    segmentation per side (subword_sampling.py); evaluation always calls it, the best one. A side
    that shows nothing is encoded as an empty one (`visible_text_or_empty`)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        source_language: str,
        target_language: str,
        target_tokenizer: Tokenizer | None = None,
        features: Sequence[str] = FEATURES,
        sampling: SubwordSampling | None = None,
    ):
        target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
        sides = {"inputs": (tokenizer, source_language), "targets": (target_tokenizer, target_language)}
        self.sides = {feature: sides[feature] for feature in features}
        self.features = tuple(features)
        self.sampling = sampling
        if sampling is not None:
            for side_tokenizer, language in self.sides.values():
                sampling.check(side_tokenizer, f"the {language} tokenizer")

    @classmethod
    def for_data(
        cls,
        data: ml_collections.ConfigDict,
        tokenizer: Tokenizer,
        target_tokenizer: Tokenizer | None = None,
        features: Sequence[str] = FEATURES,
        sampling: SubwordSampling | None = None,
    ) -> TokenizePair:
        """The sides of the data section's languages (data.source_language, data.target_language)."""
        return cls(tokenizer, data.source_language, data.target_language, target_tokenizer, features, sampling)

    def __call__(self, record) -> dict[str, np.ndarray]:
        return self._encode_sides(record, lambda tokenizer, text: tokenizer.encode(text))

    def encode_all(self, records: Iterable) -> EncodedSplit:
        """`__call__` of every record, as one EncodedSplit: each side's texts go to sentencepiece
        as one list (its own threads), not one string at a time."""
        texts = {feature: [] for feature in self.sides}
        for record in records:  # read (and decoded) once for both sides
            for feature, (_, language) in self.sides.items():
                texts[feature].append(visible_text_or_empty(record, language))
        sides = self.sides.items()
        return EncodedSplit({feature: tokenizer.encode(texts[feature]) for feature, (tokenizer, _) in sides})

    def sample(self, record, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """`__call__` with each side's segmentation drawn by `sampling` from `rng`."""
        return self._encode_sides(record, lambda tokenizer, text: self.sampling.encode(tokenizer, text, rng))

    def _encode_sides(self, record, encode: Callable[[Tokenizer, str], np.ndarray]) -> dict[str, np.ndarray]:
        return {
            feature: encode(tokenizer, visible_text_or_empty(record, language))
            for feature, (tokenizer, language) in self.sides.items()
        }


def has_a_piece_on_every_side(example: dict[str, np.ndarray]) -> bool:
    """Whether each side's ids hold a piece besides EOS. A side of zero-width spaces or control
    characters alone (text to the data reader, which keeps it) encodes to EOS alone, and so does
    one that shows nothing (`TokenizePair` encodes it as empty): trained on, the model would learn
    to translate nothing into something, or to end at once. evaluate and translate read such a
    side as empty (`has_pieces`, `has_visible_text`); so does training."""
    return all(has_pieces(ids) for ids in example.values())


def pairs_of_no_piece(
    sources: Sequence[str], references: Sequence[str], tokenizers: tuple[Tokenizer, Tokenizer]
) -> dict[int, bool]:
    """The indices of the pairs with a side the tokenizers (the source's, the reference's) encode
    to no piece, or of characters that show nothing alone (`has_visible_text`: a zero-width joiner
    is an unknown piece), each with whether its source side is one: evaluate and validation BLEU
    leave them out, as training does (translate would give such a source an empty output, which a
    score would count)."""

    def empty(texts: Sequence[str], tokenizer: Tokenizer) -> list[bool]:
        return [
            not (has_visible_text(text) and has_pieces(ids)) for text, ids in zip(texts, tokenizer.encode(list(texts)))
        ]

    empty_sides = zip(empty(sources, tokenizers[0]), empty(references, tokenizers[1]))
    return {index: source for index, (source, reference) in enumerate(empty_sides) if source or reference}


def without_a_piece(encoded: EncodedSplit) -> np.ndarray:
    """The indices of `encoded`'s records with a side of EOS alone (ids end with EOS: one id is EOS)."""
    return np.flatnonzero(np.any(np.stack(list(encoded.lengths().values())) <= 1, axis=0))


class LengthFilter:
    """Keeps examples whose sides all fit in `max_length` tokens and hold a piece each
    (`has_a_piece_on_every_side`); counts what it drops, the pairs of no piece apart.

    An endless stream whose examples are all dropped would never yield a batch: once more
    examples in a row than `give_up_after` are dropped (set by `train_dataset` to a few epochs of
    its shard, so a shard with one example that fits never gets there), it raises DataError.
    `examples`: what the log calls the training examples (pairs, or a language model's texts).
    `no_piece_reported`: the pairs of no piece were counted and reported before training (a
    split encoded once); else the first one drawn is said in a warning as it comes."""

    def __init__(self, max_length: int, examples: str = "pairs"):
        self.max_length = max_length
        self.examples = examples
        self.words = example_words(examples)
        self.seen = 0
        self.dropped = 0
        self.no_piece = 0
        self.no_piece_reported = False
        self.dropped_in_a_row = 0
        self.give_up_after: int | None = None
        self._lock = threading.Lock()  # grain may call it from several reader threads

    def __call__(self, example) -> bool:
        no_piece = not has_a_piece_on_every_side(example)
        keep = not no_piece and all(len(ids) <= self.max_length for ids in example.values())
        with self._lock:
            self.seen += 1
            self.dropped += not keep and not no_piece
            self.no_piece += no_piece
            first_no_piece = no_piece and self.no_piece == 1 and not self.no_piece_reported
            self.dropped_in_a_row = 0 if keep else self.dropped_in_a_row + 1
            if self.give_up_after is not None and self.dropped_in_a_row > self.give_up_after:
                words = self.words
                raise DataError(
                    f"no training {words.example} fits data.max_length={self.max_length} {words.tokens_each}: the "
                    f"last {self.dropped_in_a_row:,} drawn were all longer ({self.dropped:,} so far: raise "
                    f"data.max_length) or {words.had_no_piece} ({self.no_piece:,}: mend the data)"
                )
        if first_no_piece:
            logger.warning(
                "training: %s (a zero-width space, joiner or control characters alone) was drawn and is left out, "
                "as every such %s is; the validation lines count them",
                self.words.drawn_no_piece,
                self.words.example,
            )
        return keep

    def dropped_since(
        self, first_step: int, sum_over_processes: Callable[[tuple[int, int]], tuple[int, int]] | None = None
    ) -> str:
        """For the training log's validation lines: what the filter dropped of the training pairs
        read since training started (or resumed) at `first_step`; "" before any was read (a
        fine-tuning run's evaluation at step 0). The run's counts: each process reads its own
        shard, so with several the caller gives `sum_over_processes`, a collective that every
        process calls at the same validation step (before the early return, or one would wait)."""
        seen, dropped, no_piece = self.seen, self.dropped, self.no_piece
        if sum_over_processes is not None:
            seen, dropped, no_piece = sum_over_processes((seen, dropped, no_piece))
        if not seen:
            return ""
        since = "the run started" if first_step == 0 else f"it resumed at step {first_step}"
        left_out = f" and left out {no_piece:,} {self.words.with_no_piece}" if no_piece else ""
        read = f"{seen:,} training {self.examples} read since {since}"
        return f"; the length filter dropped {dropped:,}{left_out} of the {read}"


def check_some_fit(lengths: dict[str, np.ndarray], max_length: int, split: str, no_piece: int, words: ExampleWords):
    """DataError unless at least one example's sides ({feature: token counts}) all fit `max_length`;
    `no_piece`: the examples already left out for a side of no piece (all of them: said so)."""
    longest_side = np.max(np.stack(list(lengths.values())), axis=0) if lengths else np.zeros(0, np.int64)
    if not len(longest_side) and no_piece:
        raise DataError(_every_of_no_piece(split, no_piece, words))
    if not np.any(longest_side <= max_length):
        shortest = f"; the shortest needs {int(longest_side.min())}" if len(longest_side) else ""
        raise DataError(
            f"{split}: none of the {len(longest_side):,} {words.counted} fits data.max_length={max_length} "
            f"{words.tokens_each}{shortest}; raise data.max_length"
        )


def _every_of_no_piece(split: str, count: int, words: ExampleWords) -> str:
    return f"{split}: every {words.every_no_piece}: nothing to read in its {count:,} {words.examples}"


def _report_no_piece(no_piece: np.ndarray, where: str, split_index: Callable[[int], int], words: ExampleWords) -> None:
    """One warning, in the data reader's words, for the examples at `no_piece` (indices of the
    records encoded, `split_index` giving each one's place in the split) with a side of no piece."""
    if len(no_piece):
        first = f"{words.example} {split_index(int(no_piece[0])) + 1:,}; {words.first_no_piece}"
        logger.warning("%s", skipped_pairs_text(len(no_piece), where, first, words.sides))


def _pack(
    dataset: grain.IterDataset,
    row_length: int,
    num_bins: int,
    shuffle_bins: bool,
    seed: int = 0,
    features: Sequence[str] = FEATURES,
) -> grain.IterDataset:
    """First-fit packing of examples (their `features`) into rows of `row_length` tokens each side."""
    return grain.experimental.FirstFitPackIterDataset(
        dataset,
        length_struct={feature: row_length for feature in features},
        num_packing_bins=num_bins,
        seed=seed,
        shuffle_bins=shuffle_bins,
    )


def train_dataset(
    source: Sequence,
    tokenize: TokenizePair,
    data: ml_collections.ConfigDict,
    *,
    length_filter: LengthFilter | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.IterDataset:
    """An endless, deterministic stream of packed training batches; each epoch is reshuffled.

    `data` is the experiment's data section (languages, max_length, batch_size, shuffle_seed,
    num_threads, encode_once_max_examples). Each process reads the disjoint shard `shard_index`
    of `shard_count` equal shards, in batches of data.batch_size / shard_count rows. `tokenize`
    turns a record into the sides a batch holds (`TokenizePair.for_data`), or draws them
    (`tokenize.sampling`): the draws are seeded by data.shuffle_seed and each record's place in
    the endless stream, so every epoch draws anew and a restored iterator draws what it would
    have. Without sampling, a shard of at most data.encode_once_max_examples records is encoded
    once, here, and kept in memory (`EncodedSplit`); the batches and the iterator's state are
    those of encoding as the records are drawn.
    """
    batch_size = data.batch_size // shard_count
    usable = len(source) // shard_count * shard_count
    length_filter = length_filter or LengthFilter(data.max_length)
    if usable < len(source) and shard_index == 0:  # equal shards keep the processes' steps in step
        logger.info(
            "training %s: the last %d of %d are not read, so that %d input shards hold %d each",
            length_filter.examples,
            len(source) - usable,
            len(source),
            shard_count,
            usable // shard_count,
        )
    records = grain.MapDataset.source(source)[:usable][shard_index::shard_count]
    encode_once = tokenize.sampling is None and len(records) <= data.encode_once_max_examples
    length_filter.give_up_after = 3 * len(records)  # an epoch is a permutation: 2 epochs can run without a keep
    if encode_once:
        shard = range(shard_index, usable, shard_count)  # the records above, read in batches
        encoded = tokenize.encode_all(read_records(source, shard))
        # Pairs with a side of no piece, counted and said now; the filter leaves them out as they are drawn,
        # so that the other pairs come in the order, and the iterator's states are those, of a split without them.
        no_piece = without_a_piece(encoded)
        where = "the training split" if shard_count == 1 else f"input shard {shard_index} of the training split"
        words = length_filter.words
        _report_no_piece(no_piece, where, lambda index: shard_index + index * shard_count, words)
        length_filter.no_piece_reported = True
        kept = np.ones(len(encoded), bool)
        kept[no_piece] = False
        lengths = {feature: side[kept] for feature, side in encoded.lengths().items()}
        # now, not as a stream never yielding
        check_some_fit(lengths, data.max_length, "training", len(no_piece), words)
        records = grain.MapDataset.source(encoded)
    dataset = records.shuffle(seed=data.shuffle_seed).repeat(None)  # shuffle before repeat: a new order per epoch
    if tokenize.sampling is not None:
        dataset = dataset.random_map(tokenize.sample, seed=data.shuffle_seed)
    elif not encode_once:
        dataset = dataset.map(tokenize)
    dataset = dataset.filter(length_filter)
    read_options = grain.ReadOptions(num_threads=data.num_threads, prefetch_buffer_size=4 * batch_size)
    dataset = dataset.to_iter_dataset(read_options)
    packed = _pack(
        dataset, data.max_length, batch_size, shuffle_bins=True, seed=data.shuffle_seed, features=tokenize.features
    )
    return packed.batch(batch_size, drop_remainder=True)


def eval_batches(
    source: Sequence,
    tokenize: TokenizePair,
    data: ml_collections.ConfigDict,
    examples: str = "pairs",
    split: str = "validation",
) -> list[dict[str, np.ndarray]]:
    """Every example of the split `source` once (the first data.max_eval_examples of them, when
    set), packed into full batches of data.eval_batch_size rows (the last one padded with empty
    rows); `tokenize` as in `train_dataset`; `examples` as in `LengthFilter`; `split`: the split's
    name (data.eval_split), which its warnings and errors say."""
    max_length, batch_size = data.max_length, data.eval_batch_size
    count = len(source) if data.max_eval_examples is None else min(data.max_eval_examples, len(source))
    length_filter = LengthFilter(max_length, examples)
    words = length_filter.words
    length_filter.no_piece_reported = True  # below, before any is drawn
    encoded = tokenize.encode_all(read_records(source, range(count)))  # the ids `tokenize` gives each record
    no_piece = without_a_piece(encoded)
    _report_no_piece(no_piece, f"the {split} split", lambda index: index, words)
    dataset = grain.MapDataset.source(encoded).filter(length_filter)
    dataset = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    rows = list(_pack(dataset, max_length, batch_size, shuffle_bins=False, features=tokenize.features))
    if not rows and count and len(no_piece) == count:
        raise DataError(_every_of_no_piece(split, count, words))
    if not rows:
        raise DataError(
            f"{split}: none of the {count:,} {words.counted} fits data.max_length={max_length} "
            f"{words.tokens_each}; raise data.max_length"
            if count
            else f"{split}: the split has no examples"
        )
    if length_filter.dropped:
        logger.warning(
            "%s: %d of %d examples longer than %d tokens left out", split, length_filter.dropped, count, max_length
        )
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        chunk += [{key: np.zeros_like(value) for key, value in rows[0].items()}] * (batch_size - len(chunk))
        batches.append({key: np.stack([row[key] for row in chunk]) for key in rows[0]})
    return batches
