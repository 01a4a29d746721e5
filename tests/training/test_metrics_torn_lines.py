"""A torn or damaged metrics.jsonl (disk full, power loss): its torn last line cut off with one
warning naming the file and the bytes before a resumed run appends, a clean file left byte for byte,
a bad line in the middle only reported, and only the writing process touching the file."""

import json
import logging

import pytest

from jaxformer.training.metrics import MetricWriter, cut_torn_last_line
from tests.training.test_metrics import records


@pytest.mark.parametrize(
    "torn", [b'{"step": 3, "ti', b'{"step": 3, "time": 1.0}', b"\0\0\0\0", b"garbage\n", b'{"step": 3, "t\n']
)
def test_a_torn_last_line_is_cut_before_appending(tmp_path, caplog, torn):
    path = tmp_path / "metrics.jsonl"
    intact = records(3)
    path.write_bytes(intact + torn)
    with caplog.at_level(logging.WARNING):
        writer = MetricWriter(tmp_path, enabled=True)
    writer.write(7, {"loss": 1.25}, prefix="train/")
    writer.close()

    data = path.read_bytes()
    assert data.startswith(intact) and data.endswith(b"\n")
    lines = [json.loads(line) for line in data.splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 7] and lines[-1]["train/loss"] == 1.25
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(path) in warnings[0] and f"({len(torn)} bytes" in warnings[0] and "torn last line" in warnings[0]


def test_a_clean_file_is_left_byte_for_byte(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(records(3))
    with caplog.at_level(logging.WARNING):
        MetricWriter(tmp_path, enabled=True).close()
    assert path.read_bytes() == records(3)
    writer = MetricWriter(tmp_path, enabled=True)
    writer.write(3, {"loss": 1.0})
    writer.close()
    assert path.read_bytes().startswith(records(3)) and len(path.read_bytes().splitlines()) == 4
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    path.write_bytes(b"")
    assert cut_torn_last_line(path) == 0 and path.read_bytes() == b""
    assert cut_torn_last_line(tmp_path / "absent.jsonl") == 0


def test_a_bad_line_in_the_middle_is_only_reported(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    content = records(2) + b'{"step": 2, "lo{"step": 3, "time": 1.0}\n' + records(1)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert cut_torn_last_line(path) == 0
    assert path.read_bytes() == content
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0] and "line 3" in warnings[0]

    path.write_bytes(content + b'{"step": 9')  # both: the middle one reported, only the last one cut
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert cut_torn_last_line(path) == len(b'{"step": 9')
    assert path.read_bytes() == content and len(caplog.records) == 2


def test_only_the_writing_process_touches_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(records(1) + b'{"st')
    writer = MetricWriter(tmp_path, enabled=False)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert path.read_bytes() == records(1) + b'{"st'
    assert not hasattr(MetricWriter, "flush")
