"""A tensorflow-datasets builder for the user's own text (`data.name = "parallel_files"`): pairs
for a translator, or one language's sentences for a language model (`side`).

Each split comes from a file spec (`data.files.train`, `.validation`, `.test`): a TSV file, a
path with `{lang}` in it, or (a language model's) one text file; see split_files.py.

Relative paths are taken from the current directory and kept absolute. Without a validation file,
`validation_holdout` training pairs, drawn with `holdout_seed`, become the validation split
instead (and leave train). There is a test split only when a test file is given.

The prepared data (array_record, read with `builder.as_data_source(split)`) is keyed by the
fingerprint of the files read (each named by its role, e.g. `train.fr: train.fr.gz`, with size and
SHA-256) and of the settings that change it (the languages, for a language model the one read
and, from a TSV file, its column; the holdout size and seed when there is a holdout): see
`FingerprintedBuilder`. An edited file is never served from a stale copy; a language model's
data is never a translator's.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import pathlib
from collections.abc import Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds

from jaxformer.data import fingerprint as fp
from jaxformer.data.fingerprinted_builder import FingerprintedBuilder, LocalDatasetInfo
from jaxformer.data.parallel_text import DataError, SkipCounter, read_lines, skipped_in_files
from jaxformer.data.split_files import (
    SIDES,
    SPLITS,
    SplitFiles,
    prepared_splits,
    read_examples,
    read_languages,
    reader_paths,
    split_files,
    unusable_files,
)
from jaxformer.data.split_overlap import SplitOverlap, overlap_warning, split_overlaps

logger = logging.getLogger(__name__)


def hash_source_files(paths: Mapping[str, pathlib.Path]) -> dict[str, dict]:
    """`fp.hash_files(paths)`, with a file that fails to read (a disk's error, or one made
    unreadable since it was checked) as a DataError naming it."""
    try:
        return fp.hash_files(paths)
    except OSError as error:
        raise DataError(f"{error.filename}: cannot be read ({error.strerror or error})") from None


def holdout_indices(count: int, holdout: int, seed: int) -> np.ndarray:
    """The sorted positions of `holdout` of `count` pairs, drawn without replacement with `seed`."""
    return np.sort(np.random.default_rng(seed).choice(count, size=holdout, replace=False))


def _refuse_a_split_twice(files: Mapping[str, SplitFiles], hashes: Mapping[str, Mapping], unit: str) -> None:
    """A DataError when two splits are given the same text (the same files, or copies of them):
    validation BLEU, best/ and the final choice would be chosen on training pairs, or a test set
    scored on pairs trained or chosen on. `unit`: what the splits hold, "pairs" or "sentences"."""
    contents = {split: tuple(hashes[name]["sha256"] for name in given.named_paths()) for split, given in files.items()}
    empty = {split for split, given in files.items() if all(hashes[name]["size"] == 0 for name in given.named_paths())}
    for first, second in itertools.combinations(files, 2):
        if contents[first] == contents[second] and not {first, second} & empty:  # an empty one: "holds no pair"
            holdout = (
                f"; leave it unset to hold data.validation_holdout training {unit} out for validation"
                if second == "validation"
                else ""
            )
            raise DataError(
                f"data.files.{second}={files[second].spec!r} holds the same text as data.files.{first}="
                f"{files[first].spec!r}: each split needs {unit} of its own{holdout}"
            )


def _refuse_the_same_pairs_twice(files: Mapping[str, SplitFiles], pairs: Mapping[str, list], unit: str) -> None:
    """As `_refuse_a_split_twice`, for files whose bytes differ but whose pairs (or sentences) are
    the same: a compressed copy, or a TSV file of the pairs that {lang} files hold."""
    texts = {split: [example[1:] for example in examples] for split, examples in pairs.items()}
    for first, second in itertools.combinations(files, 2):
        if texts[first] == texts[second]:
            raise DataError(
                f"data.files.{second}={files[second].spec!r} holds the same {unit} as data.files.{first}="
                f"{files[first].spec!r} (in another file format): each split needs {unit} of its own"
            )


def _notes(overlaps: list[SplitOverlap], skipped: Mapping[str, SkipCounter]) -> dict:
    """The preparation notes (`_preparation_notes`): the splits' shared pairs, and each split's
    pairs skipped for an empty side (`skipped`: split -> its reader's count) by their count and
    where the first is (its line, and its file's place among the split's `reader_paths`)."""
    return {
        "split_overlaps": [dataclasses.asdict(overlap) for overlap in overlaps],
        "empty_sides": {
            split: {"count": counter.empty, "first_line": counter.first_line, "first_file": counter.first_file}
            for split, counter in skipped.items()
            if counter.empty
        },
    }


class ParallelFiles(FingerprintedBuilder):
    """The user's text files as splits train, validation (given or held out of train) and test (if
    given); features: the language codes read (both, or `side`'s), as text. See the module's docstring."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Pairs from TSV or {lang} text files; empty pairs skipped; seeded validation holdout."}
    DISPLAY_NAME = "parallel_files"

    def __init__(
        self,
        *,
        files: Mapping[str, str | None],
        source_language: str,
        target_language: str,
        validation_holdout: int = 1000,
        holdout_seed: int = 0,
        side: str | None = None,
        prepared_from: str | None = None,
        **kwargs,
    ):
        """`files`: split -> file spec (see the module), "train" required; `validation_holdout`
        pairs drawn with `holdout_seed` leave train for validation when no validation file is
        given. `side` ("source" or "target"): a language model's run, which reads that side's
        text alone; None, a translator's pairs. The files are checked to exist, then hashed. With
        `prepared_from`, the fingerprint of a run's data, files not found are no error until a
        split is read: the copy prepared from them is read instead (see `FingerprintedBuilder`)."""
        unknown = sorted(set(files) - set(SPLITS))
        if unknown:
            raise DataError(f"data.files.{unknown[0]}: no such split; parallel_files has {', '.join(SPLITS)}")
        if not files.get("train"):
            raise DataError(
                "data.name='parallel_files' needs data.files.train: a TSV file or a path with {lang} in it, "
                "e.g. --config.data.files.train=corpus/train.{lang}.gz"
            )
        if side not in (None, *SIDES):
            raise ValueError(f"side={side!r}: must be None (pairs) or one of {SIDES}")
        self._languages = (source_language, target_language)
        self._overlaps: list[SplitOverlap] | None = None  # found as the splits are prepared
        self._skipped: dict[str, SkipCounter] = {}  # each split's pairs with an empty side, as last read
        self._side, self._read = side, read_languages(self._languages, side)
        self._holdout = None if files.get("validation") else (validation_holdout, holdout_seed)
        if self._holdout is not None and validation_holdout < 1:
            raise DataError(f"data.validation_holdout={validation_holdout}: must be at least 1")
        self._files = {
            split: split_files(split, files[split], self._languages, side, missing_allowed=prepared_from is not None)
            for split in SPLITS
            if files.get(split)
        }
        missing = [str(path) for path in self._named_paths().values() if not path.exists()]
        if not missing:
            settings = {"source_language": source_language, "target_language": target_language}
            if side is not None:  # the other language's files are not read; its code picks no more than a TSV column
                settings = {"text_language": self._read[0]}
                if any(given.tsv is not None for given in self._files.values()):
                    settings["tsv_column"] = side
            if self._holdout is not None:
                settings.update(validation_holdout=validation_holdout, holdout_seed=holdout_seed)
            hashes = hash_source_files(self._named_paths())
            _refuse_a_split_twice(self._files, hashes, self._unit)
            self._set_sources(hashes, settings)
        super().__init__(
            init_args={
                "files": {split: spec.spec for split, spec in self._files.items()},
                "source_language": source_language,
                "target_language": target_language,
                "validation_holdout": validation_holdout,
                "holdout_seed": holdout_seed,
                "side": side,
                "prepared_from": prepared_from,
            },
            description="Text from the files in data.files; jaxformer_sources.json names them",
            missing=missing,
            prepared_from=prepared_from,
            **kwargs,
        )

    @property
    def given_files(self) -> dict[str, SplitFiles]:
        """split -> its files, for the splits given as files (validation may be held out instead)."""
        return dict(self._files)

    def spec_changes(self, trained_files: Mapping[str, str | None]) -> list[str]:
        """One phrase per split of data.files given otherwise than in `trained_files` (a run's
        data.files, absolute); the same paths whose files changed, where every split is as it was."""
        phrases = []
        for split in SPLITS:
            then = trained_files.get(split)
            now = self._files[split].spec if split in self._files else None
            if then is not None:
                then = os.path.abspath(os.path.expanduser(then))
            if now != then:
                given = "unset" if now is None else repr(now)
                phrases.append(f"data.files.{split} is {given}, {'unset' if then is None else repr(then)} then")
        return phrases or [f"the files at the paths of data.files ({', '.join(self._files)}) changed"]

    def split_names(self) -> list[str]:
        """The splits it prepares, known before it prepares them: the files', and validation held out of train."""
        return prepared_splits(self._files)

    def file_lines(self, split: str) -> tuple[list[int], int] | None:
        """(the 1-based line of each pair of `split` in its file(s), their line count): where a
        split's outputs go to line up with the file; None for a split held out of another and for
        the split it was held out of (its pairs are the file's less the held-out ones). Its caller
        (evaluate) reports the lines left out, with those it leaves out itself: nothing is logged here."""
        if split not in self._files or (split == "train" and self._holdout is not None):
            return None
        files = self._files[split]
        examples = read_examples(files, self._languages, self._side, SkipCounter(report=False))
        return [example[0] for example in examples], len(read_lines(files.tsv or files.by_language[self._read[0]]))

    def _split_paths(self, split: str) -> dict[str, pathlib.Path]:
        held_out = split == "validation" and self._holdout is not None
        return self._files["train" if held_out else split].named_paths()

    def _named_paths(self) -> dict[str, pathlib.Path]:
        return {name: path for files in self._files.values() for name, path in files.named_paths().items()}

    def _current_source_files(self) -> dict[str, dict]:
        unusable = [phrase for files in self._files.values() for phrase in unusable_files(files)]
        if unusable:
            raise DataError(
                f"{self._source_location()}: files went missing or unreadable while preparing: {'; '.join(unusable)}"
            )
        return hash_source_files(self._named_paths())

    def _source_location(self) -> str:
        return "data.files (" + ", ".join(f"{split}={files.spec}" for split, files in self._files.items()) + ")"

    def _source_description(self) -> str:
        return f"given in {self._source_location()}"

    def _sources_summary(self) -> str:
        count = len(self._source_files)
        summary = f"{count} file{'s' if count != 1 else ''} in {self._source_location()}"
        if self._holdout is not None:
            summary += f", validation: {self._holdout[0]} training {self._unit} held out (seed {self._holdout[1]})"
        return summary

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalDatasetInfo(
            builder=self,
            description=f"{'-'.join(self._read)} text from the user's files.",
            features=tfds.features.FeaturesDict({language: tfds.features.Text() for language in self._read}),
            supervised_keys=self._languages if self._side is None else None,
            disable_shuffling=True,  # keep file order, so test outputs line up with the references
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        pairs = self._read_splits(report=True)
        self._overlaps = split_overlaps(pairs)
        self._warn_of(self._overlaps)
        return {split: self._generate_examples(split_pairs) for split, split_pairs in pairs.items()}

    def _read_splits(self, report: bool) -> dict[str, list]:
        """split -> its examples, validation held out of train where no file gives it; with
        `report`, each split reports its own skipped pairs and the holdout is logged."""
        self._skipped = {split: SkipCounter(report=report) for split in self._files}
        pairs = {
            split: read_examples(files, self._languages, self._side, self._skipped[split])
            for split, files in self._files.items()
        }
        _refuse_the_same_pairs_twice(self._files, pairs, self._unit)
        if self._holdout is not None:
            pairs["train"], pairs["validation"] = self._hold_out(pairs["train"], report)
        return pairs

    def _warn_of(self, overlaps: list[SplitOverlap]) -> None:
        for overlap in overlaps:
            logger.warning(overlap_warning(overlap, self._files, self._holdout is not None, self._unit))

    def _preparation_notes(self) -> dict:
        if self._overlaps is None:
            return {}
        return _notes(self._overlaps, self._skipped)

    def _say_again(self, notes: dict | None) -> dict | None:
        """The pairs skipped for an empty side and the splits' shared pairs, as the preparation said
        them: a run that reuses the data would otherwise validate on training pairs, or train on
        fewer than its files hold, without a word. Data prepared before the shared pairs were
        recorded has its files read again to find both (where they are all there): those notes are
        returned, to be recorded; data whose notes have shared pairs alone says no skipped ones."""
        recorded = (notes or {}).get("split_overlaps")
        overlaps = [SplitOverlap.from_record(value) for value in recorded] if isinstance(recorded, list) else [None]
        splits, found = set(self.split_names()), None
        skipped = self._recorded_skips((notes or {}).get("empty_sides"))
        if None in overlaps or any({overlap.earlier, overlap.later} - splits for overlap in overlaps):
            overlaps = [] if self._missing else split_overlaps(self._read_splits(report=False))
            if not self._missing:
                found = _notes(overlaps, self._skipped)
                skipped = found["empty_sides"]
        for split, skip in sorted(skipped.items(), key=lambda item: SPLITS.index(item[0])):  # as read, in order
            paths = reader_paths(self._files[split], self._languages, self._side)
            sides = 2 if self._side is None else 1
            logger.warning(skipped_in_files(paths, skip["count"], skip["first_line"], skip["first_file"], sides))
        self._warn_of(overlaps)
        return found

    def _recorded_skips(self, recorded) -> dict[str, dict]:
        """The empty-side skips a record's notes hold, where they are this builder's splits' (a
        record written before they were noted holds none: nothing is said of them)."""
        if not isinstance(recorded, dict):
            return {}
        skips = {}
        for split, skip in recorded.items():
            fields = skip.keys() if isinstance(skip, dict) else ()
            if split not in self._files or set(fields) != {"count", "first_line", "first_file"}:
                continue
            files = len(reader_paths(self._files[split], self._languages, self._side))
            if all(type(value) is int for value in skip.values()) and 0 <= skip["first_file"] < files:
                skips[split] = skip
        return skips

    def _hold_out(self, train: list, report: bool = True) -> tuple[list, list]:
        """(train, validation): the seeded holdout taken out of the training pairs, file order
        kept; with `report`, logged."""
        holdout, seed = self._holdout
        if holdout >= len(train):
            raise DataError(
                f"data.validation_holdout={holdout} is as large as the training split: data.files.train="
                f"{self._files['train'].spec!r} has {len(train)} {self._examples_text}; "
                "lower data.validation_holdout or give data.files.validation"
            )
        held = np.zeros(len(train), bool)
        held[holdout_indices(len(train), holdout, seed)] = True
        if report:
            logger.warning(
                "no data.files.validation: held out %s of %s training %s as the validation split (seed %d)",
                f"{holdout:,}",
                f"{len(train):,}",
                self._unit,
                seed,
            )
        return [pair for pair, out in zip(train, held) if not out], [pair for pair, out in zip(train, held) if out]

    @property
    def _unit(self) -> str:
        """What the splits hold: "pairs", or a language model's "sentences"."""
        return "pairs" if self._side is None else "sentences"

    @property
    def _examples_text(self) -> str:
        return "pairs with text on both sides" if self._side is None else f"lines of {self._read[0]} text"

    def _generate_examples(self, examples: list[tuple]) -> Iterator[tuple[int, dict[str, str]]]:
        for number, *texts in examples:
            yield number, dict(zip(self._read, texts))
