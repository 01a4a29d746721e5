"""Every benchmark runs at --smoke size and reports rows of positive, finite numbers."""

import importlib
import json
import math

import pytest

# Columns that must be positive in every row that has them (others may be absent or 0).
POSITIVE = {
    "train_step": (
        "batch",
        "step_ms",
        "tokens_per_s",
        "model_gflop",
        "achieved_gflops",
        "peak_gflops",
        "mfu_pct",
        "params_M",
    ),
    "real_data": ("steps", "pairs", "target_tokens", "step_ms", "tokens_per_s", "pairs_per_s"),
    "decoding": ("batch", "out_len", "sentences_per_s", "tokens_per_s", "call_ms"),
    "scaling": (
        "length",
        "batch",
        "compile_s",
        "step_ms",
        "tokens_per_s",
        "total_MB",
        "predicted_ratio",
        "measured_ratio",
    ),
}


def run_smoke(name, tmp_path, capsys, *extra):
    json_path = tmp_path / f"{name}.jsonl"
    rows = importlib.import_module(f"benchmarks.{name}").main(["--smoke", "--json", str(json_path), *extra])
    printed = [
        json.loads(line[len("JSON ") :]) for line in capsys.readouterr().out.splitlines() if line.startswith("JSON ")
    ]
    written = [json.loads(line) for line in json_path.read_text().splitlines()]
    assert rows and len(printed) == len(rows) and written == printed
    for row in printed:
        assert row["benchmark"] == name
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert math.isfinite(value) and value >= 0, (key, row)
        for key in POSITIVE[name]:
            if key in row and row[key] is not None:
                assert row[key] > 0, (key, row)
    return printed


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_smoke(name, tmp_path, capsys):
    rows = run_smoke(name, tmp_path, capsys)
    assert all(row.get("impl", "jaxformer") != "torch" for row in rows)  # torch only with --torch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["train_step", "real_data", "decoding"])
def test_smoke_with_torch(name, tmp_path, capsys):
    pytest.importorskip("torch")
    rows = run_smoke(name, tmp_path, capsys, "--torch", "--torch-threads", "1")
    assert any(row["impl"] == "torch" for row in rows)
