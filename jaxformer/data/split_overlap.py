"""Pairs (or a language model's sentences) that one split of the user's files shares with another:
a training split that holds a pair more than once keeps a copy of a pair held out of it for
validation, and a validation or test file may repeat training pairs. Such pairs are not refused
(real corpora repeat short sentences) but said where the splits are prepared, and again by every
run that reuses the prepared data (`SplitOverlap` is recorded with it): validation
loss and BLEU, best/ and the final choice would otherwise be chosen on pairs trained on without a
word, as they would on a copy of the training file (which `parallel_files` refuses)."""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from collections.abc import Mapping, Sequence

from jaxformer.data.split_files import SPLITS, Example, SplitFiles

# What scoring a split on examples that an earlier split holds does: (earlier, later) -> phrase.
_CONSEQUENCES = {
    ("train", "validation"): "validation loss and BLEU, best/ and the final choice score them as trained on",
    ("train", "test"): "a test score counts them as trained on",
    ("validation", "test"): "a test score counts them as chosen on (best/, the final choice)",
}
# A language model's run scores no BLEU and keeps no best/: its validation loss is what they change.
_LANGUAGE_MODEL_VALIDATION = "the validation loss scores them as trained on"
_NAMES = {"train": "training", "validation": "validation", "test": "test"}


def shared_examples(earlier: Sequence[Example], later: Sequence[Example]) -> list[int]:
    """The line numbers (an example's first field) of `later`'s examples whose text (the other
    fields) an example of `earlier` has too, in `later`'s order. Only the (smaller) later split's
    texts are held in a set: the training split of a large corpus is scanned, not copied."""
    wanted = {example[1:] for example in later}
    found = {example[1:] for example in earlier if example[1:] in wanted}
    return [example[0] for example in later if example[1:] in found]


def first_file(files: SplitFiles) -> pathlib.Path:
    """The file a line number of `files` is named in: the TSV file, or the first language's."""
    return files.tsv if files.tsv is not None else next(iter(files.by_language.values()))


@dataclasses.dataclass(frozen=True)
class SplitOverlap:
    """`shared` of the `total` examples of split `later` are in split `earlier` too, the first at
    `first_line` of `later`'s file (of the training file, for a validation split held out of it).
    Recorded with the prepared data (JSON, as `dataclasses.asdict` gives it), to be said again
    whenever the data is reused; a record's file paths are not kept, as the same files copied
    elsewhere share the prepared data."""

    earlier: str
    later: str
    shared: int
    total: int
    first_line: int

    @classmethod
    def from_record(cls, value) -> SplitOverlap | None:
        """The overlap a prepared data's record holds, or None where it holds no such thing."""
        fields = [field.name for field in dataclasses.fields(cls)]
        if not isinstance(value, dict) or set(value) != set(fields):
            return None
        if (value["earlier"], value["later"]) not in _CONSEQUENCES:
            return None
        if not all(type(value[name]) is int for name in fields[2:]):
            return None
        return cls(**value)


def split_overlaps(examples: Mapping[str, Sequence[Example]]) -> list[SplitOverlap]:
    """Each pair of splits in `examples` (split -> (line, text...) examples) where the later
    shares examples with the earlier, in SPLITS' order."""
    overlaps = []
    for earlier, later in itertools.combinations([split for split in SPLITS if split in examples], 2):
        lines = shared_examples(examples[earlier], examples[later])
        if lines:
            overlaps.append(SplitOverlap(earlier, later, len(lines), len(examples[later]), lines[0]))
    return overlaps


def overlap_warning(overlap: SplitOverlap, files: Mapping[str, SplitFiles], held_out: bool, unit: str) -> str:
    """The warning of `overlap`. `files`: split -> its files; with `held_out`, the validation split
    was drawn from the training file (its lines are that file's). `unit`: "pairs" or "sentences"."""
    earlier, later, count = overlap.earlier, overlap.later, overlap.shared
    if later == "validation" and held_out:
        where = f"held out of data.files.train={files['train'].spec!r}"
        first = f"{first_file(files['train'])}:{overlap.first_line}"
        also = f"also in the training split (the file holds them more than once; first at {first})"
    else:
        where = f"in data.files.{later}={files[later].spec!r}"
        also = f"also in the {_NAMES[earlier]} split (first at {first_file(files[later])}:{overlap.first_line})"
    language_model_validation = unit == "sentences" and later == "validation"
    consequence = _LANGUAGE_MODEL_VALIDATION if language_model_validation else _CONSEQUENCES[earlier, later]
    verb = "is" if count == 1 else "are"
    return f"{count:,} of the {overlap.total:,} {later} {unit} {where} {verb} {also}: {consequence}"
