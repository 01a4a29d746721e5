"""TensorBoard event files of scalar metrics, written directly: no TensorFlow, no tensorboardX.

tensorboardX imports torch whenever torch is installed (5 s at the start of every training
process on a 2-core machine, Colab included), to write what takes a few lines: an event file
is a TFRecord file of `Event` protocol buffers (tensorflow/core/util/event.proto), the first
one naming the format version, each later one holding a `Summary` of (tag, simple_value)
pairs (tensorflow/core/framework/summary.proto). Only the fields used here are encoded.
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import socket
import struct
import time
from collections.abc import Mapping

FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, the checksum TFRecord files use."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated and offset, so that a CRC stored in data checks cleanly."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 is encoded as its two's complement, in 10 bytes
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


FLOAT32_MAX = 3.4028234663852886e38


def _float32(value: float) -> float:
    """`value` as a float32 holds it: beyond its range, infinity of the same sign (struct refuses those)."""
    return math.copysign(math.inf, value) if math.isfinite(value) and abs(value) > FLOAT32_MAX else value


def scalar_summary(scalars: Mapping[str, float]) -> bytes:
    """A `Summary` proto: one Value(tag = 1, simple_value = 2, a float32) per scalar."""
    values = (
        _length_delimited(1, tag.encode("utf-8")) + b"\x15" + struct.pack("<f", _float32(value))
        for tag, value in scalars.items()
    )
    return b"".join(_length_delimited(1, value) for value in values)


# SessionLog (event.proto) { status = 1: START = 1 }: TensorBoard drops every event of the run
# at its step or later read before it (EventAccumulator's purge of orphaned data).
SESSION_START = _varint(1 << 3 | 0) + _varint(1)


def event(
    wall_time: float,
    step: int = 0,
    *,
    file_version: bytes | None = None,
    summary: bytes | None = None,
    session_log: bytes | None = None,
) -> bytes:
    """An `Event` proto: wall_time = 1 (double), step = 2, file_version = 3, summary = 5 or
    session_log = 7."""
    encoded = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        encoded += _length_delimited(3, file_version)
    if summary is not None:
        encoded += _length_delimited(5, summary)
    if session_log is not None:
        encoded += _length_delimited(7, session_log)
    return encoded


class ScalarEventWriter:
    """Appends scalars to a new event file in `directory`, named as TensorBoard expects
    (events.out.tfevents.<seconds>.<host>.<pid>.<n>: a resumed run writes a file of its own
    beside the earlier ones, and TensorBoard reads them all). `first_step`: the first step this
    writer writes, where it takes over from the earlier files: a session start at that step tells
    TensorBoard to drop their records of it and later steps (a segment that stopped before its
    next checkpoint, trained again now), as metrics.jsonl moves them aside.

    `open_now=False` leaves the file uncreated until something is written (`path` is None until
    then): a finished run started again, which writes nothing, added an event file holding only
    its session start each time."""

    def __init__(self, directory: str | os.PathLike, first_step: int | None = None, open_now: bool = True):
        self._directory, self._first_step = pathlib.Path(directory), first_step
        self._file = None
        self.path: pathlib.Path | None = None
        if open_now:
            self._open()

    def _open(self) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        stem = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
        for number in itertools.count():
            self.path = self._directory / f"{stem}.{number}"
            try:
                self._file = open(self.path, "xb")  # never another writer's file
                break
            except FileExistsError:
                continue
        self._file.write(tfrecord(event(now, file_version=FILE_VERSION)))
        if self._first_step is not None:
            self._file.write(tfrecord(event(now, self._first_step, session_log=SESSION_START)))
        self._file.flush()

    def write(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> None:
        """`wall_time`: when the scalars were measured, for a record written again; now if None."""
        wall_time = time.time() if wall_time is None else wall_time
        if self._file is None:
            self._open()
        self._file.write(tfrecord(event(wall_time, step, summary=scalar_summary(scalars))))
        self._file.flush()

    def restart_at(self, step: int) -> None:
        """A session start at `step`: TensorBoard drops every event of `step` and later read before it."""
        if self._file is None:
            self._open()
        self._file.write(tfrecord(event(time.time(), step, session_log=SESSION_START)))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
