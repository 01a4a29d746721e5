"""A prepared split checked when it is opened, and read with errors that name it: a damaged copy
(a file cut short or with other bytes, a missing `dataset_info.json`) is one line naming the file
and the folder to remove, not a Riegeli or KeyError traceback from the tokenizer or the pipeline.

Opening reads each of the split's files' index and its first and last records (milliseconds);
bytes damaged in between are found when they are read (`ReadableSplit`).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

from array_record.python import array_record_module

from jaxformer.data.parallel_text import DataError


def damaged(builder, problem: str) -> DataError:
    """The DataError for `builder`'s prepared data, damaged as `problem` says."""
    return DataError(
        f"the prepared {builder.name} data in {builder.data_dir} is damaged: {problem}; "
        f"remove {builder.data_dir} so that it is prepared again"
    )


def split_problem(builder, split: str) -> str | None:
    """What makes `split` of `builder`'s prepared data unreadable, naming the file; None if nothing
    does (also for data tfds's mock_data serves, which is not on disk)."""
    folder = pathlib.Path(builder.data_dir)
    if not folder.is_dir():
        return None
    info = folder / "dataset_info.json"
    if not info.is_file():
        return f"{info} is missing"
    if split not in builder.info.splits or getattr(builder.info.file_format, "value", None) != "array_record":
        return None  # an unknown split is refused by name next; other file formats are not probed
    for instruction in builder.info.splits[split].file_instructions:
        path = pathlib.Path(os.fspath(instruction.filename))
        if not path.is_file():
            return f"{path} is missing"
        try:
            reader = array_record_module.ArrayRecordReader(str(path), options="readahead_buffer_size:0")
            try:
                count = reader.num_records()
                if count != instruction.examples_in_shard:
                    return f"{path} holds {count:,} records, not {instruction.examples_in_shard:,}"
                if count:
                    reader.read([0, count - 1])
            finally:
                reader.close()
        except RuntimeError as error:
            return f"{path} cannot be read ({_first_line(error)})"
    return None


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


class ReadableSplit(Sequence):
    """A random-access source (`builder.as_data_source(split)`) whose read errors (a record in a
    damaged file) are DataErrors naming the file, the prepared data and the folder to remove."""

    def __init__(self, source: Sequence, builder, split: str):
        self._source, self._builder, self._split = source, builder, split

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, key):
        try:
            return self._source[key]
        except RuntimeError as error:  # array_record's only error for a file it cannot read
            raise self._damaged(key, error) from None

    def __getitems__(self, keys: Sequence[int]) -> list:
        """Many records at once, read in parallel where the source can (array_record's)."""
        batched = getattr(self._source, "__getitems__", None)
        if batched is None:
            return [self[key] for key in keys]
        try:
            return list(batched(keys))
        except RuntimeError as error:
            for key in keys:  # one at a time, to name the file of the record that fails
                self[key]
            raise self._damaged(None, error) from None

    def _damaged(self, key: int | None, error: RuntimeError) -> DataError:
        path = None if key is None else self._file_of(key)
        where = f"its {self._split} split" if path is None else str(path)
        return damaged(self._builder, f"{where} cannot be read ({_first_line(error)})")

    def _file_of(self, key: int) -> pathlib.Path | None:
        """The file holding record `key`: the split's files hold its records in order."""
        try:
            instructions = self._builder.info.splits[self._split].file_instructions
        except (KeyError, AttributeError, TypeError):  # no files (tfds's mock data)
            return None
        start = 0
        for instruction in instructions:
            count = instruction.take if instruction.take >= 0 else instruction.examples_in_shard - instruction.skip
            if start <= key < start + count:
                return pathlib.Path(os.fspath(instruction.filename))
            start += count
        return None

    def __repr__(self) -> str:
        return f"ReadableSplit({self._source!r})"
