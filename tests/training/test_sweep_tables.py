"""jaxformer-sweep's files: the rows of earlier invocations kept (a shorter sweep file, a stopped or
failed sweep), a variant's late error named, a signal outside the training loop (what a sweep
killed outright left: test_sweep_killed.py). The runs are stand-ins that write a finished run's
last metrics, except where the real run's setup is the point."""

import json
import signal

import pytest

from jaxformer.commands import sweep as sweep_command
from jaxformer.commands.sweep import EARLIER, merge_rows, results_table
from jaxformer.data.parallel_text import DataError
from jaxformer.run.directory import RunDirectory
from jaxformer.training import loop, run_start
from jaxformer.training.final_choice import CANDIDATES
from tests.training.test_sweep import SHARED, TINY, write_sweep

pytestmark = pytest.mark.xdist_group("sweep")


def row(variant, bleu, steps=100):
    return {
        **{"variant": variant, "changes": f"changes of {variant}", "steps": steps, "speed": None},
        **{"train_minutes": 1.0, "chosen": "best", "bleu": bleu, "alpha": 0.6, "lowercase_bleu": None, "chrf": None},
        **{f"{name}_bleu": bleu for name in CANDIDATES},
    }


def table_rows(table):
    """{variant: {column: cell}} of a Markdown table."""
    lines = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    return {cells[0]: dict(zip(lines[0], cells)) for cells in lines[2:]}


def test_this_invocations_rows_replace_the_same_variants_and_the_others_are_kept_marked():
    earlier = [row("baseline", 30.0), row("wide", 31.0), row("deep", 29.0)]
    this = [row("baseline", 30.5), row("new", 32.0)]
    merged = merge_rows(earlier, this)
    assert [(r["variant"], r["bleu"], bool(r.get(EARLIER))) for r in merged] == [
        ("baseline", 30.5, False),
        ("new", 32.0, False),
        ("wide", 31.0, True),
        ("deep", 29.0, True),
    ]
    cells = table_rows(results_table(merged))
    assert list(cells) == ["new", "wide", "baseline", "deep"]  # all ranked together
    assert {name: cell["note"] for name, cell in cells.items()} == {
        "new": "",
        "wide": "from an earlier invocation",
        "baseline": "",
        "deep": "from an earlier invocation",
    }
    # Kept again by the next invocation, until one trains the variant again.
    again = merge_rows(merged, [row("wide", 31.5)])
    assert {r["variant"]: bool(r.get(EARLIER)) for r in again} == {
        "wide": False,
        "baseline": True,
        "new": True,
        "deep": True,
    }
    assert "note" not in results_table(this)  # nothing kept: no column


def test_the_speed_column_is_there_only_when_a_row_has_a_speed():
    wall_clock = [row("baseline", 30.0), row("wide", 31.0)]
    assert list(table_rows(results_table(wall_clock))["wide"]) == [
        *("variant", "changes", "steps", "train minutes", "validation BLEU", "chosen", "alpha", *CANDIDATES),
    ]
    paced = [row("baseline", 30.0) | {"speed": 1.0}, row("wide", 31.0) | {"speed": 0.75}]
    cells = table_rows(results_table(paced))
    assert list(cells["wide"])[:4] == ["variant", "changes", "steps", "speed"]
    assert {name: cell["speed"] for name, cell in cells.items()} == {"baseline": "1.00", "wide": "0.75"}


class Runs:
    """A stand-in for train_and_evaluate: each run 'finishes' at once (its last metrics, scored by
    its seed), or does what `events[run name]` says: a signal number (stopped), an exception, or
    ("complete", a signal number): finished, the signal having come as its final choice ended."""

    def __init__(self, events=None):
        self.events = events or {}
        self.trained = []

    def __call__(self, config, workdir):
        name = workdir.rsplit("/", 1)[1]
        self.trained.append(name)
        event = self.events.get(name)
        if isinstance(event, Exception):
            raise event
        if event is not None and not isinstance(event, tuple):
            return {"step": 3, "stopped_by_signal": event}
        bleu = 20.0 + config.training.seed + config.data.shuffle_seed / 10
        last = {"step": 12, "train_seconds": 60.0, "final": {"chosen": "best", "bleu": bleu, "best/bleu": bleu}}
        path = RunDirectory(workdir).last_metrics_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(last))
        return last if event is None else {**last, "signal_once_complete": event[1]}


def run_sweep(tmp_path, capsys, sweep, *flags):
    # --baseline_steps sets the steps: SHARED's step count would be refused beside it.
    shared = [flag for flag in SHARED if "--baseline_steps" not in flags or "num_train_steps" not in flag]
    code = sweep_command.main(
        ["--config", TINY, "--sweep", str(write_sweep(tmp_path / "sweep.py", sweep))]
        + ["--workdir", str(tmp_path / "sweep"), f"--config.data.data_dir={tmp_path / 'data'}", *shared, *flags]
    )
    return code, capsys.readouterr()


def rows_file(workdir):
    return [json.loads(line) for line in (workdir / "sweep.jsonl").read_text().splitlines()]


def earlier_sweep(tmp_path):
    """A workdir whose last invocation finished baseline, wide and deep."""
    workdir = tmp_path / "sweep"
    workdir.mkdir()
    earlier = [row("baseline", 30.0), row("wide", 31.0), row("deep", 29.0)]
    (workdir / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    (workdir / "sweep.md").write_text(results_table(earlier))
    return workdir, earlier


def test_a_sweep_file_with_fewer_variants_keeps_the_rows_of_the_others(tmp_path, capsys, monkeypatch):
    workdir, earlier = earlier_sweep(tmp_path)
    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs())
    code, output = run_sweep(tmp_path, capsys, {"baseline": [], "new": ["data.shuffle_seed=1"]})
    assert code == 0, output.err
    assert runs.trained == ["baseline", "new"]
    rows = {r["variant"]: r for r in rows_file(workdir)}
    assert {name: (r["bleu"], bool(r.get(EARLIER))) for name, r in rows.items()} == {
        "baseline": (20.0, False),
        "new": (20.1, False),
        "wide": (31.0, True),
        "deep": (29.0, True),
    }
    for kept in earlier[1:]:
        assert {key: rows[kept["variant"]][key] for key in kept} == kept  # as the earlier invocation wrote it
    table = (workdir / "sweep.md").read_text()
    assert table in output.out
    # Rows of an older jaxformer (no record of their validation pairs) without their runs: said, not silent.
    assert {name: cells["note"] for name, cells in table_rows(table).items()} == {
        "wide": "from an earlier invocation, validation pairs unchecked",
        "deep": "from an earlier invocation, validation pairs unchecked",
        "baseline": "",
        "new": "",
    }
    assert "keeping the rows an earlier invocation wrote for wide, deep, which this one has none for" in output.err
    assert "cannot check that the rows of wide, deep, kept from an earlier invocation, were scored" in output.err


def test_a_stopped_sweep_writes_its_finished_rows_and_keeps_the_earlier_ones(tmp_path, capsys, monkeypatch):
    workdir, earlier = earlier_sweep(tmp_path)
    # new finishes both seeds; baseline's second seed is stopped: baseline keeps its earlier row.
    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs({"baseline@seed1": signal.SIGTERM}))
    code, output = run_sweep(tmp_path, capsys, {"new": ["data.shuffle_seed=1"], "baseline": []}, "--seeds", "2")
    assert code == 128 + signal.SIGTERM, output.err
    assert runs.trained == ["new", "new@seed1", "baseline", "baseline@seed1"]
    assert "sweep stopped after 1 of 2 variants" in output.err
    rows = {r["variant"]: r for r in rows_file(workdir)}
    assert rows.keys() == {"new", "baseline", "wide", "deep"}
    assert rows["new"]["seed_bleus"] == [20.1, 21.2] and not rows["new"].get(EARLIER)
    for kept in earlier:
        assert rows[kept["variant"]] == {**kept, EARLIER: True}
    assert len(table_rows((workdir / "sweep.md").read_text())) == 4

    # Stopped before any variant finished: the files stay as they are.
    before = {name: (workdir / name).read_bytes() for name in ("sweep.jsonl", "sweep.md")}
    monkeypatch.setattr(loop, "train_and_evaluate", Runs({"other": signal.SIGINT}))
    code, output = run_sweep(tmp_path, capsys, {"other": ["data.shuffle_seed=2"]})
    assert code == 128 + signal.SIGINT, output.err
    assert {name: (workdir / name).read_bytes() for name in before} == before


@pytest.mark.parametrize(
    "seeds, signalled, finished",
    [(1, "first", ["first"]), (2, "first@seed1", ["first"]), (2, "first", [])],
)
def test_a_signal_as_a_run_completes_stops_the_sweep_with_its_row(
    tmp_path, capsys, monkeypatch, seeds, signalled, finished
):
    """The run is complete when the signal comes as its final choice ends (loop.py says so and
    returns 'signal_once_complete'): the sweep keeps its row when it was the variant's last run,
    then stops, as a signal anywhere else stops it, instead of training the next variant."""
    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs({signalled: ("complete", signal.SIGTERM)}))
    code, output = run_sweep(tmp_path, capsys, {"first": [], "second": ["data.shuffle_seed=1"]}, "--seeds", str(seeds))
    assert code == 128 + signal.SIGTERM, output.err
    assert runs.trained[-1] == signalled and "second" not in runs.trained
    assert f"sweep stopped after {len(finished)} of 2 variants" in output.err
    workdir = tmp_path / "sweep"
    if finished:
        assert [r["variant"] for r in rows_file(workdir)] == finished
    else:  # its other seed is not trained: no row yet, nothing written
        assert not (workdir / "sweep.jsonl").exists()


@pytest.mark.parametrize("seeds, named", [(1, "variant 'bigvocab'"), (2, "variant 'bigvocab' (seed +1)")])
def test_a_variants_late_error_names_it_and_keeps_the_finished_rows(tmp_path, capsys, monkeypatch, seeds, named):
    message = "cannot train a 60000-piece unigram tokenizer on 4000 sentences"
    failing = "bigvocab" if seeds == 1 else "bigvocab@seed1"
    monkeypatch.setattr(loop, "train_and_evaluate", Runs({failing: DataError(message)}))
    sweep = {"baseline": [], "bigvocab": ["tokenizer.vocab_size=60000"]}
    code, output = run_sweep(tmp_path, capsys, sweep, "--seeds", str(seeds))
    assert code == 2
    assert output.err.endswith(f"\nerror: {named}: {message}\n") and output.err.count("error: ") == 1
    workdir = tmp_path / "sweep"
    assert [r["variant"] for r in rows_file(workdir)] == ["baseline"]
    assert list(table_rows((workdir / "sweep.md").read_text())) == ["baseline"]


def test_a_signal_while_a_variant_sets_up_stops_the_sweep_and_frees_its_workdir(tmp_path, capsys, monkeypatch):
    def default_handler(signum, frame):  # what the sweep must replace: the process would die here
        raise AssertionError(f"signal {signum} reached the handler the sweep started with")

    def stop_during_setup(*args):  # the real run's setup, its workdir locked, before its loop
        assert RunDirectory(tmp_path / "sweep" / "second").lock_file.exists()
        signal.raise_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, default_handler)
    try:
        real, runs = loop.train_and_evaluate, Runs()
        monkeypatch.setattr(loop, "train_and_evaluate", lambda c, w: (runs if w.endswith("/first") else real)(c, w))
        monkeypatch.setattr(run_start, "check_same_run", stop_during_setup)
        code, output = run_sweep(tmp_path, capsys, {"first": [], "second": ["data.shuffle_seed=1"]})
        assert signal.getsignal(signal.SIGTERM) is default_handler  # given back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 128 + signal.SIGTERM, output.err
    assert "stopped by SIGTERM before training began: nothing to save; exiting with 143" in output.err
    assert "sweep stopped after 1 of 2 variants" in output.err
    assert not RunDirectory(tmp_path / "sweep" / "second").lock_file.exists()
    assert [r["variant"] for r in rows_file(tmp_path / "sweep")] == ["first"]


@pytest.mark.parametrize(
    "contents, message",
    [
        ("{not json\n", r"sweep.jsonl line 1 is not a JSON object; fix or remove that line"),
        ('{"variant": "a"}\n', r"sweep.jsonl line 1 is not a sweep row: its 'changes' is missing; fix or remove"),
        (None, r"sweep.md has no sweep.jsonl beside it"),
        # Every field a row may hold, as the table shows it: not found only once the sweep has trained.
        (
            row("a", 1.0) | {"speed": "fast"},
            "line 1 is not a sweep row: its 'speed' is 'fast', not a finite number or null",
        ),
        (row("a", 1.0) | {"seed_bleus": ["x"]}, "its 'seed_bleus' is ['x'], not a list of finite numbers"),
        (row("a", 1.0) | {"latest_bleu": "x"}, "its 'latest_bleu' is 'x', not a finite number or null"),
        (row("a", 1.0) | {"alpha": "x"}, "its 'alpha' is 'x', not a finite number or null"),
        (row("a", 1.0) | {"seeds": 5}, "its 'seeds' is 5, not a list of its seeds' rows"),
        (row("a", 1.0) | {"bleu": float("nan")}, "its 'bleu' is nan, not a finite number"),
        (row("a", 1.0) | {"steps": True}, "its 'steps' is True, not a finite number"),
        (row("a", 1.0) | {"seeds": [row("a", 1.0) | {"alpha": "x"}]}, "its 'seeds' item 0: 'alpha' is 'x', not a"),
        (row("a", 1.0) | {"seeds": [row("a", 1.0), 3]}, "its 'seeds' item 1: it is not a JSON object"),
        (row("a", 1.0) | {EARLIER: "yes"}, "its 'from_earlier_invocation' is 'yes', not true or false"),
        (row("a", 1.0) | {"validation": "m30k"}, "its 'validation' is 'm30k', not the JSON object of its validation"),
    ],
)
def test_an_unreadable_rows_file_is_one_line_before_anything_trains(tmp_path, capsys, monkeypatch, contents, message):
    workdir = tmp_path / "sweep"
    workdir.mkdir()
    (workdir / "sweep.md").write_text("| variant |\n| --- |\n| a |\n")
    if contents is not None:
        (workdir / "sweep.jsonl").write_text(contents if isinstance(contents, str) else json.dumps(contents) + "\n")
    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs())
    before = {path.name: path.read_bytes() for path in workdir.iterdir()}
    code, output = run_sweep(tmp_path, capsys, {"baseline": []})
    assert code == 2 and output.err.startswith("error: ") and output.err.count("\n") == 1, output.err
    assert message in output.err
    assert runs.trained == []
    assert {path.name: path.read_bytes() for path in workdir.iterdir()} == before


def test_a_second_row_of_one_variant_is_an_error_naming_its_line(tmp_path, capsys, monkeypatch):
    workdir = tmp_path / "sweep"
    workdir.mkdir()
    (workdir / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [row("a", 1.0), row("a", 2.0)]))
    monkeypatch.setattr(loop, "train_and_evaluate", Runs())
    code, output = run_sweep(tmp_path, capsys, {"baseline": []})
    assert code == 2 and output.err.strip().endswith("sweep.jsonl line 2: a second row of variant 'a'; remove one")


def test_a_directory_where_the_rows_file_goes_is_named_as_one(tmp_path, capsys, monkeypatch):
    workdir = tmp_path / "sweep"
    (workdir / "sweep.jsonl").mkdir(parents=True)
    (workdir / "sweep.md").write_text("| variant |\n| --- |\n")
    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs())
    code, output = run_sweep(tmp_path, capsys, {"baseline": []})
    assert code == 2 and output.err == (
        f"error: {workdir / 'sweep.jsonl'} is a directory (or another non-file), where the sweep keeps a file: "
        "move it away\n"
    )
    assert runs.trained == []


def test_the_rows_are_written_before_the_table_is_made(tmp_path, capsys, monkeypatch):
    """A table that cannot be made (a bug in it) loses no finished row: the rows are written first."""

    def broken_table(rows, unchecked=()):
        raise RuntimeError("the table's bug")

    monkeypatch.setattr(loop, "train_and_evaluate", runs := Runs())
    monkeypatch.setattr(sweep_command, "results_table", broken_table)
    with pytest.raises(RuntimeError, match="the table's bug"):
        run_sweep(tmp_path, capsys, {"baseline": [], "new": ["data.shuffle_seed=1"]})
    # Written as the first variant finished: the bug stops the sweep there.
    assert runs.trained == ["baseline"]
    assert [r["variant"] for r in rows_file(tmp_path / "sweep")] == ["baseline"]


def test_each_variants_row_is_written_as_it_finishes(tmp_path, capsys, monkeypatch):
    """A sweep killed outright (kill -9) while a later variant trains keeps the finished ones' rows:
    a next invocation whose sweep file leaves them out still shows them."""
    workdir, earlier = earlier_sweep(tmp_path)
    seen = {}

    def runs(config, run_dir):
        if run_dir.endswith("/second"):  # what a kill -9 now would leave
            seen["rows"] = [(r["variant"], r.get(EARLIER, False)) for r in rows_file(workdir)]
            seen["table"] = list(table_rows((workdir / "sweep.md").read_text()))
        return Runs()(config, run_dir)

    monkeypatch.setattr(loop, "train_and_evaluate", runs)
    code, _ = run_sweep(tmp_path, capsys, {"first": [], "second": ["data.shuffle_seed=1"]})
    assert code == 0
    assert seen["rows"] == [("first", False), ("baseline", True), ("wide", True), ("deep", True)]
    assert seen["table"] == ["wide", "baseline", "deep", "first"]


def test_the_help_quotes_the_multi30k_model_of_today():
    from jaxformer.configs import multi30k

    assert f"d_model {multi30k.get_config().model.d_model} model" in " ".join(sweep_command.__doc__.split())
