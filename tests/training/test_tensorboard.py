"""The TensorBoard event files jaxformer writes itself, read back with tensorboardX's protocol
buffers and checksums (an independent implementation of the same format), and compared with
what tensorboardX's own SummaryWriter writes for the same scalars."""

import math
import struct
import subprocess
import sys

from jaxformer.training.metrics import MetricWriter
from jaxformer.training.tensorboard import FILE_VERSION, ScalarEventWriter, crc32c

SCALARS = [
    (0, {"train/loss": 9.5}),
    (10, {"train/loss": 4.25, "train/learning_rate": 3.1e-4, "eval/bleu": 27.0}),
    (2**40, {"eval/ü-tag": -1.5, "nan": float("nan"), "inf": float("inf")}),
]


def read_events(path):
    """Every Event in a TFRecord file, each record's two masked CRCs checked with tensorboardX's."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data, events, offset = path.read_bytes(), [], 0
    while offset < len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        payload = data[offset + 12 : offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
        assert header_crc == masked_crc32c(header) and payload_crc == masked_crc32c(payload)
        event = Event()
        event.ParseFromString(payload)
        events.append(event)
        offset += 16 + length
    assert offset == len(data)
    return events


def scalars_of(events):
    """[(step, tag, value)] of the summary events, in file order."""
    return [(e.step, v.tag, v.simple_value) for e in events if e.HasField("summary") for v in e.summary.value]


def same(a, b):
    return all(
        (sa, ta) == (sb, tb) and (va == vb or (math.isnan(va) and math.isnan(vb)))
        for (sa, ta, va), (sb, tb, vb) in zip(a, b, strict=True)
    )


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # RFC 3720's check value for CRC-32C
    assert crc32c(b"") == 0


def test_events_read_back_as_tensorboardx_writes_them(tmp_path):
    from tensorboardX import SummaryWriter

    ours = ScalarEventWriter(tmp_path / "ours")
    theirs = SummaryWriter(str(tmp_path / "theirs"))
    for step, scalars in SCALARS:
        ours.write(step, scalars)
        for tag, value in scalars.items():
            theirs.add_scalar(tag, value, step)
    ours.close()
    theirs.close()

    events = read_events(ours.path)
    assert events[0].file_version == FILE_VERSION.decode() and events[0].wall_time > 1.6e9
    (their_file,) = (tmp_path / "theirs").iterdir()
    their_scalars = scalars_of(read_events(their_file))
    assert same(scalars_of(events), their_scalars)
    assert len(their_scalars) == sum(len(scalars) for _, scalars in SCALARS)


def test_a_resumed_writer_adds_a_file_and_keeps_the_earlier_one(tmp_path):
    first = MetricWriter(tmp_path, enabled=True)
    first.write(1, {"loss": 2.0}, prefix="train/")
    first.close()
    earlier = {path: path.read_bytes() for path in (tmp_path / "tensorboard").iterdir()}
    second = MetricWriter(tmp_path, enabled=True)
    second.write(2, {"loss": 1.0}, prefix="train/")
    second.close()
    files = sorted((tmp_path / "tensorboard").iterdir())
    assert len(files) == 2 and all(path.read_bytes() == data for path, data in earlier.items())
    assert sorted(s for path in files for s in scalars_of(read_events(path))) == [
        (1, "train/loss", 2.0),
        (2, "train/loss", 1.0),
    ]


def test_a_resumed_writer_tells_tensorboard_to_drop_the_steps_trained_again(tmp_path):
    """The records after the checkpoint a run resumed from (a segment that stopped before its next
    checkpoint) are superseded: a session start at the first step written again, TensorBoard's
    sign to drop the earlier files' events at that step and after, as metrics.jsonl moves them."""
    from tensorboardX.proto.event_pb2 import SessionLog

    first = MetricWriter(tmp_path, enabled=True, start_step=-1)  # a new run
    for step in range(1, 8):
        first.write(step, {"loss": 1.0 / step}, prefix="train/")
    first.close()
    MetricWriter(tmp_path, enabled=True, start_step=4).close()
    starts = sorted(
        event.step
        for path in (tmp_path / "tensorboard").iterdir()
        for event in read_events(path)
        if event.HasField("session_log") and event.session_log.status == SessionLog.START
    )
    assert starts == [0, 5]  # a new run supersedes every earlier record; the resume, steps 5 and after


def test_a_value_beyond_float32_is_written_as_infinity(tmp_path):
    """A diverging run's perplexity (exp of a loss above 88.7) raised OverflowError mid-training."""
    writer = ScalarEventWriter(tmp_path)
    writer.write(2, {"train/perplexity": math.exp(177.8), "train/low": -1e39, "train/loss": 177.8})
    writer.close()
    assert scalars_of(read_events(writer.path)) == [
        (2, "train/perplexity", math.inf),
        (2, "train/low", -math.inf),
        (2, "train/loss", struct.unpack("<f", struct.pack("<f", 177.8))[0]),
    ]


def test_training_imports_neither_torch_nor_tensorboardx():
    code = (
        "import sys, jaxformer.commands.train; print(sorted(m for m in ('torch', 'tensorboardX') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
