"""jaxformer-sweep's checks of the runs already in its workdir, all made before anything trains
(a config, a step budget or data files other than the sweep gives a run now), and its lock on the
workdir. The runs are stand-ins that leave a finished run's last metrics and what the sweep reads
of its checkpoint (its config and data fingerprint). The rows kept from an earlier invocation:
test_sweep_kept_rows.py."""

import json
import pathlib
import shutil
import socket
import subprocess
import types

import pytest

from jaxformer.commands import sweep as sweep_command
from jaxformer.errors import CheckpointError
from jaxformer.run import loading
from jaxformer.run.directory import RunDirectory, SweepDirectory
from jaxformer.run.lock import SweepLock
from jaxformer.training import init_from, loop, sweep_pace
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.pace import Pace
from tests.conftest import RAW
from tests.training.test_loop import ONE_LAYER
from tests.training.test_sweep import SHARED, TINY, write_sweep
from tests.training.test_sweep_tables import Runs, rows_file

pytestmark = pytest.mark.xdist_group("sweep")


class SavedRuns(Runs):
    """Runs that also leave what the sweep reads of a run's checkpoint, as training saves it: its
    config (with absolute paths), the fingerprint of the data files it read and its start (with
    the identity of its parameters)."""

    def __call__(self, config, workdir):
        from jaxformer.data.sources import data_fingerprint, get_builder

        last = super().__call__(config, workdir)
        saved = {
            "config": with_absolute_paths(config).to_dict(),
            "data_fingerprint": data_fingerprint(get_builder(config.data)),
        }
        points = init_from.load_starting_points(config.training, params=False)
        saved.update(started_from=init_from.started_from(points))
        saved.update(started_from_params=init_from.started_from_params(points))
        RunDirectory(workdir).checkpoints.mkdir(parents=True, exist_ok=True)
        (pathlib.Path(workdir) / "saved.json").write_text(json.dumps(saved))
        return last


def load_saved(run_dir, which, params=True):
    path = pathlib.Path(run_dir) / "saved.json"
    if not path.is_file():
        raise CheckpointError(f"no checkpoint in {run_dir}")
    return 12, types.SimpleNamespace(**json.loads(path.read_text())), None


@pytest.fixture
def runs(monkeypatch):
    monkeypatch.setattr(loop, "train_and_evaluate", runs := SavedRuns())
    monkeypatch.setattr(loading, "load_checkpoint", load_saved)
    # Every variant here changes constants only: not timed, as pace.py finds without compiling.
    monkeypatch.setattr(sweep_pace, "relative_pace", lambda config, reference, *checks: Pace(1.0, 1.0, timed=False))
    return runs


def sweep(tmp_path, capsys, variants, *flags, shared=SHARED):
    """(the exit code, stderr: its error line alone when it failed, after the log's)"""
    code = sweep_command.main(
        ["--config", TINY, "--sweep", str(write_sweep(tmp_path / "sweep.py", variants))]
        + ["--workdir", str(tmp_path / "sweep"), f"--config.data.data_dir={tmp_path / 'data'}", *shared, *flags]
    )
    err = capsys.readouterr().err
    if code == 0:
        return code, err
    assert err.count("error: ") == 1 and err.endswith("\n"), err
    return code, err[err.index("error: ") :]


STEPLESS = [flag for flag in SHARED if not flag.startswith("--config.training.num_train_steps=")]  # --baseline_steps'


def test_a_run_that_no_longer_fits_is_refused_before_the_variants_before_it_train(tmp_path, capsys, runs):
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]})
    assert code == 0, err
    workdir = tmp_path / "sweep"
    shutil.rmtree(workdir / "baseline")
    runs.trained.clear()
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.5"]})
    assert code == 2 and err.count("\n") == 1, err
    assert err == (
        f"error: variant 'lr3' finished in {workdir / 'lr3'} with another configuration than the sweep gives it "
        f"now: optimizer.learning_rate_scale: 3.0 -> 3.5; sweep in a new --workdir, or remove {workdir / 'lr3'} "
        "to train it again\n"
    )
    assert runs.trained == []  # baseline, before it, was not trained first


def test_a_workdir_of_another_step_budget_is_refused_before_a_new_variant_trains(tmp_path, capsys, runs):
    variants = {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}
    code, err = sweep(tmp_path, capsys, variants, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 0, err
    runs.trained.clear()
    workdir = tmp_path / "sweep"
    more = {"new": ["model.dropout_rate=0.2"], **variants}
    code, err = sweep(tmp_path, capsys, more, "--baseline_steps", "30", shared=STEPLESS)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: 2 problems with the runs in {workdir}, found before training any: ")
    for number, name in enumerate(["baseline", "lr3"], 1):
        assert (
            f"({number}) variant {name!r} was given its steps for --baseline_steps 20 "
            f"({workdir / 'pace' / name}.json), not 30: run with 20 or in a new --workdir"
        ) in err
    assert runs.trained == [] and not (workdir / "pace" / "new.json").exists()
    # With 20, as the workdir's runs had: the new variant trains, the others are finished.
    code, err = sweep(tmp_path, capsys, more, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 0, err
    assert runs.trained == ["new"]


def test_runs_of_the_other_kind_of_budget_are_all_named_at_once(tmp_path, capsys, runs):
    variants = {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}
    assert sweep(tmp_path, capsys, variants)[0] == 0
    workdir = tmp_path / "sweep"
    code, err = sweep(tmp_path, capsys, variants, "--baseline_steps", "12", shared=STEPLESS)
    assert code == 2 and err.count("\n") == 1, err
    for number, name in enumerate(["baseline", "lr3"], 1):
        assert (
            f"({number}) variant {name!r} finished in {workdir / name} with the config's own budget, not a "
            "--baseline_steps one: run without --baseline_steps or in a new --workdir"
        ) in err
    # A pace kept for a variant: its runs had a step budget.
    (workdir / "pace").mkdir()
    (workdir / "pace" / "lr3.json").write_text(json.dumps({"baseline_steps": 12, "steps": 12, "speed": 1.0}))
    code, err = sweep(tmp_path, capsys, {"new": ["model.dropout_rate=0.2"], **variants})
    assert code == 2 and err == (
        f"error: variant 'lr3' in {workdir} trains for a step budget ({workdir / 'pace' / 'lr3.json'}): "
        "run with --baseline_steps 12\n"
    )
    assert runs.trained == ["baseline", "lr3"]  # the first invocation's only


def test_a_run_trained_on_other_data_files_is_refused_before_anything_trains(tmp_path, capsys, runs):
    first, other = tmp_path / "raw", tmp_path / "other_raw"
    shutil.copytree(RAW, first)
    shutil.copytree(RAW, other)
    (other / "val.de.gz").write_bytes((RAW / "val.en.gz").read_bytes())  # another file under the same name
    variants = {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}
    assert sweep(tmp_path, capsys, variants, f"--config.data.raw_dir={first}")[0] == 0
    runs.trained.clear()
    assert sweep(tmp_path, capsys, variants, f"--config.data.raw_dir={first}")[0] == 0  # the same files: counted
    shutil.copytree(RAW, tmp_path / "copy")
    assert sweep(tmp_path, capsys, variants, f"--config.data.raw_dir={tmp_path / 'copy'}")[0] == 0  # a copy too
    assert runs.trained == []

    shutil.rmtree(tmp_path / "sweep" / "baseline")
    code, err = sweep(tmp_path, capsys, variants, f"--config.data.raw_dir={other}")
    assert code == 2 and err.count("\n") == 1, err
    run_dir = tmp_path / "sweep" / "lr3"
    saved = json.loads((run_dir / "saved.json").read_text())["data_fingerprint"]
    assert err.startswith(
        f"error: variant 'lr3' finished in {run_dir} was trained on other data files (fingerprint {saved}) than the "
        "sweep gives it now (sha256:"
    )
    assert err.endswith(
        f", data.raw_dir={str(other)!r}); restore those files, or sweep in a new --workdir, or "
        f"remove {run_dir} to train it again\n"
    )
    assert runs.trained == []


def test_a_file_where_a_variant_trains_is_refused_before_the_variants_before_it_train(tmp_path, capsys, runs):
    workdir = tmp_path / "sweep"
    workdir.mkdir()
    (workdir / "lr3@seed1").write_text("notes")
    (workdir / "lr3@seed2").symlink_to(tmp_path / "nowhere")
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}, "--seeds", "3")
    assert code == 2 and err.startswith(f"error: 2 problems with the runs in {workdir}, found before training any: ")
    for name in ("lr3@seed1", "lr3@seed2"):
        assert f"variant 'lr3': {workdir / name}, where it trains, is not a folder: move it away" in err
    assert runs.trained == []
    (workdir / "lr3@seed1").unlink()
    (workdir / "lr3@seed2").unlink()
    (workdir / "lr3" / "last_metrics.json").mkdir(parents=True)  # where its run writes once trained
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]})
    last_metrics = workdir / "lr3" / "last_metrics.json"
    assert (code, err) == (
        2,
        f"error: {last_metrics} is a folder, where the run writes its last metrics: move it away\n",
    )
    shutil.rmtree(workdir / "lr3")  # and what its run checks before any work: met only as lr3's turn came
    (workdir / "lr3").mkdir()
    (workdir / "lr3" / "tensorboard").write_text("notes")
    (workdir / "lr3@seed1" / "tokenizer.model").mkdir(parents=True)
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}, "--seeds", "2")
    assert code == 2 and err.startswith(f"error: 2 problems with the runs in {workdir}, found before training any: ")
    assert f"variant 'lr3': {workdir / 'lr3' / 'tensorboard'} is not a directory, where the run writes its " in err
    assert f"variant 'lr3': {workdir / 'lr3@seed1' / 'tokenizer.model'} is a folder, where the run saves its " in err
    assert runs.trained == []
    # Under --baseline_steps, where the paces are written once measured.
    variants = {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}
    shutil.rmtree(workdir)
    workdir.mkdir()
    (workdir / "pace").write_text("notes")
    code, err = sweep(tmp_path, capsys, variants, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 2 and f"variant 'lr3': {workdir / 'pace'}, where the sweep keeps the paces, is not a folder" in err
    (workdir / "pace").unlink()
    (workdir / "pace" / "lr3.json").mkdir(parents=True)
    code, err = sweep(tmp_path, capsys, variants, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 2 and err == (
        f"error: variant 'lr3': {workdir / 'pace' / 'lr3.json'}, where its pace is kept, is not a file: move it away\n"
    )
    assert runs.trained == []


def test_every_seed_of_every_variant_is_checked_before_any_trains(tmp_path, capsys, runs):
    """Seed k moves training.seed and data.shuffle_seed by k: a seed past its range was refused only
    when its turn came, after the runs before it had trained, and a variant setting the seeds could
    train another variant's seed again."""
    top = {"baseline": [], "top": ["training.seed=2147483647"]}
    code, err = sweep(tmp_path, capsys, top, "--seeds", "2")
    assert (code, err) == (
        2,
        "error: run 'top@seed1' (--seeds 2 moves training.seed and data.shuffle_seed by 1): config "
        "training.seed=2147483648: must be an integer from 0 to 2147483647\n",
    )
    moved = {"baseline": [], "moved": ["training.seed=1", "data.shuffle_seed=1"]}
    code, err = sweep(tmp_path, capsys, moved, "--seeds", "2")
    assert code == 2 and err.startswith("error: runs 'baseline@seed1' and 'moved' give the same config "), err
    assert runs.trained == []
    assert sweep(tmp_path, capsys, moved)[0] == 0  # one seed: no two runs alike
    assert runs.trained == ["baseline", "moved"]


def test_a_second_sweep_in_the_same_workdir_is_refused_naming_the_first(tmp_path, capsys, runs):
    workdir = tmp_path / "sweep"
    workdir.mkdir()
    with SweepLock(workdir):  # as another jaxformer-sweep, alive, would hold it
        code, err = sweep(tmp_path, capsys, {"baseline": []})
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {workdir} is in use by another jaxformer-sweep: pid ")
    assert runs.trained == [] and list(workdir.iterdir()) == []

    # One whose holder is gone does not block: it is taken over, said in the log.
    finished = subprocess.Popen(["true"])
    finished.wait()
    lock = SweepDirectory(workdir).lock_file
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": finished.pid, "start_time": 0}))
    code, err = sweep(tmp_path, capsys, {"baseline": []})
    assert code == 0, err
    assert f"took over {lock} from a jaxformer-sweep that is no longer alive" in err
    assert runs.trained == ["baseline"] and not lock.exists()
    assert [row["variant"] for row in rows_file(workdir)] == ["baseline"]


def test_a_variant_may_not_be_named_like_the_sweeps_lock(tmp_path, capsys):
    code, err = sweep(tmp_path, capsys, {"baseline": [], "sweep.lock": ["model.dropout_rate=0.2"]})
    assert code == 2 and "variant name 'sweep.lock' is taken" in err, err


def test_a_damaged_pace_or_last_metrics_file_is_one_line_naming_it(tmp_path, capsys, runs):
    variants = {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}
    assert sweep(tmp_path, capsys, variants, "--baseline_steps", "20", shared=STEPLESS)[0] == 0
    workdir = tmp_path / "sweep"
    pace = workdir / "pace" / "lr3.json"
    pace.write_text(pace.read_text()[:10])  # cut short, as a full disk leaves a file
    runs.trained.clear()
    for flags in (["--baseline_steps", "20"], []):  # read by either kind of budget's check
        code, err = sweep(tmp_path, capsys, variants, *flags, shared=STEPLESS if flags else SHARED)
        assert code == 2 and err == (
            f"error: {pace} is damaged (not a pace record with baseline_steps, steps, speed): remove it to measure "
            "the variant's pace again, and the variant's runs with it, if any (they trained for the steps it held)\n"
        )
    pace.write_text(json.dumps({"baseline_steps": 20, "steps": "20", "speed": 1.0}))  # JSON, not a pace's
    code, err = sweep(tmp_path, capsys, variants, "--baseline_steps", "20", shared=STEPLESS)
    assert code == 2 and err.startswith(f"error: {pace} is damaged"), err

    shutil.rmtree(workdir)
    assert sweep(tmp_path, capsys, variants)[0] == 0
    last_metrics = workdir / "lr3" / "last_metrics.json"
    finished = json.loads(last_metrics.read_text())
    for damaged in ('{"step": 12, "fin', "[]"):
        last_metrics.write_text(damaged)
        code, err = sweep(tmp_path, capsys, variants)
        assert code == 2 and err == (
            f"error: {last_metrics} is damaged (not a run's last metrics): remove it, and the sweep runs that "
            "variant's run again, which finds its steps and final choice saved and writes the file anew\n"
        )
    # A JSON object, but without what the variant's row takes: named, where it was a traceback (or
    # a NaN row that sweep.jsonl refused on the next invocation).
    for key, value, named in (
        ("step", None, "its step is None, not an integer"),
        ("step", "12", "its step is '12', not an integer"),
        ("train_seconds", True, "its train_seconds is True, not a finite number"),
        ("final.chosen", None, "its final.chosen is None, not a string"),
        ("final.bleu", float("nan"), "its final.bleu is nan, not a finite number"),
        ("final.latest/bleu", "x", "its final.latest/bleu is 'x', not a finite number or null"),
    ):
        edited = json.loads(json.dumps(finished))
        if key.startswith("final."):
            edited["final"][key.removeprefix("final.")] = value
        else:
            edited[key] = value
        last_metrics.write_text(json.dumps(edited))
        code, err = sweep(tmp_path, capsys, variants)
        assert code == 2 and err.startswith(f"error: {last_metrics} is damaged (not a run's last metrics; {named}):")
    assert runs.trained == ["baseline", "lr3"]  # the second sweep's only


def test_a_variant_that_does_not_fit_the_fine_tuning_start_is_refused_before_any_trains(tmp_path, capsys, runs):
    from tests.conftest import make_workdir

    parent, _, _ = make_workdir(tmp_path / "parent")  # tiny's model section, post-norm, 2 + 2 layers
    before = sorted((path, path.stat().st_mtime_ns) for path in parent.rglob("*"))
    variants = {"baseline": [], "pre": ["model.normalization=pre"]}
    shared = [flag for flag in SHARED if flag not in ONE_LAYER]
    code, err = sweep(tmp_path, capsys, variants, f"--config.training.init_from={parent}", shared=shared)
    assert code == 2 and err.count("\n") == 1, err
    assert err == (
        f"error: variant 'pre': training.init_from: step 1 of {parent / 'checkpoints'} was trained with another "
        "model section; set it as in that run: model.normalization='post' there, 'pre' here\n"
    )
    assert runs.trained == []  # baseline, before it, was not trained first
    missing = tmp_path / "gone"
    code, err = sweep(tmp_path, capsys, variants, f"--config.training.init_from={missing}", shared=shared)
    assert code == 2 and err.count("\n") == 1, err
    assert f"(1) variant 'baseline': training.init_from: {missing} does not exist" in err
    assert f"(2) variant 'pre': training.init_from: {missing} does not exist" in err
    assert runs.trained == [] and not (tmp_path / "sweep").exists()
    assert sorted((path, path.stat().st_mtime_ns) for path in parent.rglob("*")) == before  # read, never written


def test_a_run_that_started_from_another_checkpoint_than_its_start_names_now_is_refused(tmp_path, capsys, runs):
    from tests.conftest import make_workdir

    parent, _, _ = make_workdir(tmp_path / "parent", steps=(1, 2))
    shared = [flag for flag in SHARED if flag not in ONE_LAYER] + [f"--config.training.init_from={parent}"]
    code, err = sweep(tmp_path, capsys, {"baseline": []}, shared=shared)
    assert code == 0, err
    shutil.rmtree(parent / "checkpoints" / "2")  # its latest is step 1 now
    runs.trained.clear()
    code, err = sweep(tmp_path, capsys, {"baseline": [], "lr3": ["optimizer.learning_rate_scale=3.0"]}, shared=shared)
    run_dir = tmp_path / "sweep" / "baseline"
    assert code == 2 and err == (
        f"error: variant 'baseline' finished in {run_dir} started from training.init_from: step 2 of "
        f"{parent / 'checkpoints'}, and the sweep's runs would start from training.init_from: step 1 of "
        f"{parent / 'checkpoints'} now: they would not compare; restore that start, sweep in a new --workdir, "
        f"or remove {run_dir} to train it again\n"
    )
    assert runs.trained == []  # lr3 was not trained from the other start
