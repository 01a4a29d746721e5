"""jaxformer-sweep's rows kept from an earlier invocation (variants its sweep file now leaves out),
ranked with its own: each must compare with this invocation's (the kind of budget, its N, the
validation pairs), checked by the row's own record when its run is gone."""

import json
import shutil

import pytest

from tests.training.test_sweep import SHARED
from tests.training.test_sweep_checks import STEPLESS, runs, sweep  # noqa: F401 (runs: the fixture)
from tests.training.test_sweep_tables import rows_file, table_rows

pytestmark = pytest.mark.xdist_group("sweep")


def test_the_rows_kept_from_an_earlier_invocation_must_compare_with_this_ones(tmp_path, capsys, runs):  # noqa: F811
    """Rows of variants this sweep file leaves out stay in the table, ranked with its own: one of
    another kind of budget, another N or other validation pairs is an error naming it, before
    anything trains, as a run of the sweep file's own variants would be."""
    earlier = {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}
    assert sweep(tmp_path, capsys, earlier)[0] == 0
    workdir = tmp_path / "sweep"
    kept = f"whose row {workdir / 'sweep.jsonl'} keeps from an earlier invocation,"
    remedy = "remove its row from sweep.jsonl, or sweep in a new --workdir"
    new = {"new": ["model.dropout_rate=0.2"]}
    runs.trained.clear()
    code, err = sweep(tmp_path, capsys, new, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 2 and err.startswith(f"error: 2 problems with the runs in {workdir}, found before training any: ")
    for number, name in enumerate(["baseline", "lr3"], 1):
        assert (
            f"({number}) variant {name!r}, {kept} trained with the config's own budget, not a --baseline_steps one: "
            f"run without --baseline_steps, or {remedy}"
        ) in err
    fewer = [flag for flag in SHARED if not flag.startswith("--config.data.max_eval_examples=")]
    code, err = sweep(tmp_path, capsys, new, "--config.data.max_eval_examples=8", shared=fewer)
    expected = (
        f"(2) variant 'lr3', {kept} was scored on other validation pairs than this sweep's variants "
        f"(data.max_eval_examples: 16 -> 8), so its BLEU would not compare with theirs: {remedy}"
    )
    assert code == 2 and expected in err, err
    assert runs.trained == [] and not (workdir / "new").exists()
    assert sweep(tmp_path, capsys, new)[0] == 0  # the same budget and pairs: kept and ranked with it
    assert runs.trained == ["new"]

    # A step-budgeted workdir: its rows are neither wall-clock ones nor another N's.
    shutil.rmtree(workdir)
    assert sweep(tmp_path, capsys, earlier, "--baseline_steps", "20", shared=STEPLESS)[0] == 0
    code, err = sweep(tmp_path, capsys, new)
    expected = (
        f"(1) variant 'baseline', {kept} trained for a step budget ({workdir / 'pace' / 'baseline.json'}): "
        f"run with --baseline_steps 20, or {remedy}"
    )
    assert code == 2 and expected in err, err
    code, err = sweep(tmp_path, capsys, new, "--baseline_steps", "30", shared=STEPLESS)
    expected = f"(2) variant 'lr3', {kept} was given its steps for --baseline_steps 20, not 30: {remedy}"
    assert code == 2 and expected in err, err
    (workdir / "pace" / "lr3.json").unlink()  # its row's speed still tells
    code, err = sweep(tmp_path, capsys, new, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 2 and err == (
        f"error: variant 'lr3', {kept} trained for a step budget whose pace record, {workdir / 'pace' / 'lr3.json'}, "
        f"is gone: its N cannot be checked against --baseline_steps 20; {remedy}\n"
    )
    code, err = sweep(tmp_path, capsys, new)
    assert code == 2 and "variant 'lr3', " in err and "trained for a step budget (its row has a speed)" in err, err
    assert runs.trained == ["new", "baseline", "lr3"]


def test_a_kept_row_is_checked_by_its_own_record_when_its_run_is_gone(tmp_path, capsys, runs):  # noqa: F811
    """A row records which validation pairs scored it, so it is checked with its run's folder
    removed; a row an older jaxformer wrote without that record is checked by its run's checkpoint,
    and without either it is ranked unchecked, which the log and the table say."""
    assert sweep(tmp_path, capsys, {"lr3": ["optimizer.learning_rate_scale=3.0"]})[0] == 0
    workdir = tmp_path / "sweep"
    shutil.rmtree(workdir / "lr3")
    fewer = [flag for flag in SHARED if not flag.startswith("--config.data.max_eval_examples=")]
    new = {"new": ["model.dropout_rate=0.2"]}
    runs.trained.clear()
    code, err = sweep(tmp_path, capsys, new, "--config.data.max_eval_examples=8", shared=fewer)

    def other_pairs(name):
        return (
            f"error: variant {name!r}, whose row {workdir / 'sweep.jsonl'} keeps from an earlier invocation, was "
            "scored on other validation pairs than this sweep's variants (data.max_eval_examples: 16 -> 8), so its "
            "BLEU would not compare with theirs: remove its row from sweep.jsonl, or sweep in a new --workdir\n"
        )

    assert code == 2 and err == other_pairs("lr3")
    assert runs.trained == [] and not (workdir / "new").exists()
    code, err = sweep(tmp_path, capsys, new)  # the same pairs: ranked with this sweep's rows
    assert code == 0 and runs.trained == ["new"] and "cannot check" not in err
    notes = {name: cells["note"] for name, cells in table_rows((workdir / "sweep.md").read_text()).items()}
    assert notes == {"new": "", "lr3": "from an earlier invocation"}

    # Rows as an older jaxformer wrote them: new's run is there, lr3's is gone.
    older = [{key: value for key, value in row.items() if key != "validation"} for row in rows_file(workdir)]
    (workdir / "sweep.jsonl").write_text("".join(json.dumps(row) + "\n" for row in older))
    other = {"other": ["model.dropout_rate=0.3"]}
    code, err = sweep(tmp_path, capsys, other, "--config.data.max_eval_examples=8", shared=fewer)
    assert code == 2 and err == other_pairs("new")  # lr3: nothing tells
    code, err = sweep(tmp_path, capsys, other)
    assert code == 0 and runs.trained == ["new", "other"]
    assert (
        "cannot check that the rows of lr3, kept from an earlier invocation, were scored on this sweep's validation "
        "pairs: an older jaxformer wrote them without recording those, and their runs' checkpoints are gone or "
        "unreadable; ranked unchecked (marked so in sweep.md)"
    ) in err
    notes = {name: cells["note"] for name, cells in table_rows((workdir / "sweep.md").read_text()).items()}
    assert notes == {
        "other": "",
        "new": "from an earlier invocation",
        "lr3": "from an earlier invocation, validation pairs unchecked",
    }
    assert rows_file(workdir)[0]["validation"]["data.max_eval_examples"] == 16  # this invocation's row records it
