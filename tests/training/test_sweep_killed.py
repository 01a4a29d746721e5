"""What a jaxformer-sweep killed outright (kill -9) left, found by the next invocation: the
temporaries of the files it was writing, a finished variant's lock, a pace record measured for a
variant since edited. The runs are test_sweep_tables.py's stand-ins."""

import json

import pytest

from jaxformer.training import loop
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.sweep import make_variants
from tests.training.test_sweep import SHARED, TINY
from tests.training.test_sweep_tables import Runs, run_sweep

pytestmark = pytest.mark.xdist_group("sweep")


def test_a_sweep_removes_the_temporaries_a_killed_sweep_left_and_nothing_else(tmp_path, capsys, monkeypatch):
    """kill -9 as a sweep wrote sweep.jsonl, sweep.md or a pace record left its temporary, which no
    run's start removes (they are not a run's files)."""
    workdir = tmp_path / "sweep"
    (workdir / "pace").mkdir(parents=True)
    left = [workdir / ".sweep.jsonl.0123abcd.tmp", workdir / ".sweep.md.deadbeef.tmp"]
    left += [workdir / "pace" / ".gone.json.89abcdef.tmp", workdir / "pace" / ".gone.json.01234567.tmp"]
    kept = [workdir / ".sweep.jsonl.tmp", workdir / ".notes.md.0123abcd.tmp", workdir / "pace" / ".x.json.TMP.tmp"]
    for path in left + kept:
        path.write_text("half")
    monkeypatch.setattr(loop, "train_and_evaluate", Runs())
    code, output = run_sweep(tmp_path, capsys, {"baseline": []})
    assert code == 0, output.err
    assert [path for path in left if path.exists()] == []
    assert all(path.read_text() == "half" for path in kept)
    for path in left:
        destination = path.parent / path.name[1:].rsplit(".", 2)[0]
        assert f"removed {path}, left by a sweep killed while writing {destination}" in output.err


def test_a_finished_variants_lock_left_by_a_killed_sweep_is_taken_over_and_a_live_ones_refused(
    tmp_path, capsys, monkeypatch
):
    """kill -9 after a run wrote its last metrics, before it released its lock: the next invocation
    reuses the run and frees its workdir (the lock was left for good); a live holder is named."""
    from jaxformer.training import sweep_checks
    from tests.run.test_lock import dead_pid, write_lock

    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs())
    monkeypatch.setattr(sweep_checks, "_problems", lambda *args: [])  # a stand-in's run has no checkpoint to check
    assert run_sweep(tmp_path, capsys, {"baseline": []})[0] == 0
    run_dir = tmp_path / "sweep" / "baseline"
    write_lock(run_dir, pid=(killed := dead_pid()))
    code, output = run_sweep(tmp_path, capsys, {"baseline": []})
    assert code == 0 and runs.trained == ["baseline"], output.err
    assert f"took over {run_dir / 'lock'} from a training run that is no longer alive (pid {killed}" in output.err
    assert not (run_dir / "lock").exists()
    write_lock(run_dir, pid=1)  # alive: a run training in the finished variant's folder now
    code, output = run_sweep(tmp_path, capsys, {"baseline": []})
    assert code == 2 and output.err.splitlines()[-1].startswith(
        f"error: variant 'baseline': {run_dir} is in use by another training run: pid 1 on host"
    ), output.err
    assert (run_dir / "lock").exists() and runs.trained == ["baseline"]


def test_a_pace_record_measured_for_an_edited_variant_is_an_error_before_anything_trains(tmp_path, capsys, monkeypatch):
    """kill -9 after a variant's pace was written, the sweep file edited: its steps were another config's."""
    workdir = tmp_path / "sweep"
    (workdir / "pace").mkdir(parents=True)
    record = {"baseline_steps": 10, "steps": 4, "speed": 0.4, "changes": "optimizer.learning_rate_scale=4.0"}
    (workdir / "pace" / "fast.json").write_text(json.dumps(record))
    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs())
    sweep = {"fast": ["optimizer.learning_rate_scale=3.0"]}
    code, output = run_sweep(tmp_path, capsys, sweep, "--baseline_steps", "10")
    assert code == 2 and runs.trained == [], output.err
    assert output.err.splitlines()[-1].endswith(
        f"variant 'fast': its pace record, {workdir / 'pace' / 'fast.json'}, was measured for "
        "optimizer.learning_rate_scale=4.0, not for optimizer.learning_rate_scale=3.0 as the sweep gives it now: "
        "remove it (and the variant's runs, if any) to measure its pace again, or sweep in a new --workdir"
    )

    # Measured for the variant as it is, under other --config values given to the command (another batch).
    shared = [tuple(flag.removeprefix("--config.").split("=", 1)) for flag in SHARED if "num_train_steps" not in flag]
    (variant,) = make_variants(TINY, sweep, [*shared, ("data.batch_size", "8")])
    record |= {"changes": variant.changes(), "config": with_absolute_paths(variant.config).to_dict()}
    (workdir / "pace" / "fast.json").write_text(json.dumps(record))
    code, output = run_sweep(tmp_path, capsys, sweep, "--baseline_steps", "10")
    assert code == 2 and runs.trained == [], output.err
    assert output.err.splitlines()[-1].endswith(
        "was measured for another configuration than the sweep gives it now: data.batch_size: 8 -> 4; remove it "
        "(and the variant's runs, if any) to measure its pace again, or sweep in a new --workdir"
    )
    code, output = run_sweep(tmp_path, capsys, sweep, "--baseline_steps", "10", "--config.data.batch_size=8")
    assert code == 0 and runs.trained == ["fast"], output.err
