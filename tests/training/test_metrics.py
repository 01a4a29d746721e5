import json
import logging
import math
import pathlib

import numpy as np
import pytest

from jaxformer.training.metrics import MetricWriter


def records(count):
    return b"".join(json.dumps({"step": step, "time": 1.0, "loss": 2.5}).encode() + b"\n" for step in range(count))


@pytest.mark.parametrize("bad", ["loss_sum", "grad_norm"])
def test_a_non_finite_step_stops_training_naming_the_step_and_the_last_good_checkpoint(tmp_path, bad):
    import types

    import tqdm

    from jaxformer.training.train_metrics import NonFiniteLossError, TrainMetrics

    checkpointer = types.SimpleNamespace(steps=lambda: [20, 40], directory=tmp_path / "checkpoints")
    writer = MetricWriter(tmp_path, enabled=True)
    metrics = TrainMetrics(writer, checkpointer, tqdm.tqdm(disable=True))
    good = {"loss_sum": 8.0, "nll_sum": 8.0, "correct": 1.0, "weight": 4.0, "learning_rate": 1e-3, "grad_norm": 1.0}
    metrics.add(41, good)
    metrics.flush()
    metrics.add(42, good)
    metrics.add(43, {**good, bad: float("nan")})
    with pytest.raises(
        NonFiniteLossError, match=r"at step 43; stopping without saving: the last good checkpoint is step 40"
    ):
        metrics.flush()
    writer.close()
    logged = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == [41]  # nothing of the interval with the NaN is written


def test_a_resumed_run_moves_the_records_of_the_steps_it_trains_again(tmp_path, caplog):
    path, moved_to = tmp_path / "metrics.jsonl", tmp_path / "metrics.rolled_back.jsonl"
    first_segment = records(8)  # steps 0-7 logged; the newest checkpoint is step 4's
    lines = first_segment.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]) + b"not a record\n" + b"".join(lines[3:]))  # a bad line stays put
    with caplog.at_level(logging.WARNING):
        writer = MetricWriter(tmp_path, enabled=True, start_step=4)
    writer.write(5, {"loss": 1.5})
    writer.close()
    steps = [json.loads(line)["step"] for line in path.read_bytes().splitlines() if line.startswith(b"{")]
    assert steps == [0, 1, 2, 3, 4, 5] and b"not a record\n" in path.read_bytes()
    assert moved_to.read_bytes() == b"".join(lines[5:])  # steps 5-7, as written
    (warning,) = [r.getMessage() for r in caplog.records if "moved" in r.getMessage()]
    assert warning == f"{path}: moved 3 record(s) of steps after 4, which this run trains again, to {moved_to}"
    # A second resume from the same step moves the second segment's record after the first's.
    MetricWriter(tmp_path, enabled=True, start_step=4).close()
    assert [json.loads(line)["step"] for line in moved_to.read_bytes().splitlines()] == [5, 6, 7, 5]
    assert not list(tmp_path.glob(".*moving"))


def test_a_resumed_run_reads_metrics_jsonl_once_at_its_start(tmp_path, monkeypatch):
    """Its torn last line cut, the records of the steps it trains again moved, those of the step it
    resumed at kept for the loop: all from one read of the file (a long run's is large)."""
    import builtins

    from jaxformer.training import metrics as module

    path = tmp_path / "metrics.jsonl"
    lines = records(8).splitlines(keepends=True)
    path.write_bytes(b"".join(lines) + b'{"step": 8, "ti')  # torn: killed mid-write
    reads = []

    def counted_open(file, mode="r", *args, **kwargs):
        if pathlib.Path(file) == path and mode in ("r", "rb"):
            reads.append(mode)
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(module, "open", counted_open, raising=False)
    writer = MetricWriter(tmp_path, enabled=True, start_step=4)
    writer.close()
    assert len(reads) == 1
    assert path.read_bytes() == b"".join(lines[:5])  # the torn line cut, steps 5-7 moved
    assert (tmp_path / "metrics.rolled_back.jsonl").read_bytes() == b"".join(lines[5:])
    assert writer.records_at_start == [json.loads(lines[4])]


def test_the_work_of_the_step_resumed_at_written_again_moves_the_earlier_records(tmp_path, caplog):
    """A run resumed from an interim checkpoint (step 10) with its length shortened past it does
    step 10's evaluation and train/ summary: once more where the stop came after the evaluation, and
    again after a kill before the end was saved. metrics.jsonl and TensorBoard end with the records
    of a run never stopped, one of each; the earlier ones go to metrics.rolled_back.jsonl."""
    from tests.training.test_tensorboard import read_events

    train = {"loss": 2.0, "accuracy": 0.4}
    evaluation = {"loss": 2.5, "perplexity": math.inf}

    def records_by_kind(path):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return sorted((line.pop("step"), sorted((k, v) for k, v in line.items() if k != "time")) for line in lines)

    def tensorboard_view(workdir):
        """(step, tag, value) as TensorBoard shows them: a session start drops the events read before it
        at its step and later."""
        shown = []
        for path in sorted((workdir / "tensorboard").iterdir()):
            for event in read_events(path):
                if event.HasField("session_log"):
                    shown = [scalar for scalar in shown if scalar[0] < event.step]
                shown += [(event.step, value.tag, value.simple_value) for value in event.summary.value]
        return sorted(shown)

    (tmp_path / "straight").mkdir(), (tmp_path / "stopped").mkdir()
    straight = MetricWriter(tmp_path / "straight", enabled=True, start_step=-1)
    for step, scalars, prefix in ((9, train, "train/"), (10, evaluation, "eval/"), (10, {"seconds": 9.0}, "budget/")):
        straight.write(step, scalars, prefix=prefix)
    straight.write(10, {**train, "loss": 1.5}, prefix="train/")
    straight.close()

    stopped = MetricWriter(tmp_path / "stopped", enabled=True, start_step=-1)  # stopped after step 10's evaluation
    for step, scalars, prefix in ((9, train, "train/"), (10, evaluation, "eval/"), (10, {"seconds": 9.0}, "budget/")):
        stopped.write(step, scalars, prefix=prefix)
    stopped.close()
    for _ in ("killed before the end was saved", "resumed again"):
        with caplog.at_level(logging.WARNING):
            resumed = MetricWriter(tmp_path / "stopped", enabled=True, start_step=10)
            resumed.write(10, evaluation, prefix="eval/")
            resumed.write(10, {**train, "loss": 1.5}, prefix="train/")  # the interval the checkpoint kept
            resumed.close()

    metrics, moved_to = tmp_path / "stopped" / "metrics.jsonl", tmp_path / "stopped" / "metrics.rolled_back.jsonl"
    assert records_by_kind(metrics) == records_by_kind(tmp_path / "straight" / "metrics.jsonl")
    assert [(record[0], record[1][0][0]) for record in records_by_kind(moved_to)] == [
        (10, "eval/loss"),
        (10, "eval/loss"),
        (10, "train/accuracy"),
    ]
    assert tensorboard_view(tmp_path / "stopped") == tensorboard_view(tmp_path / "straight")
    warnings = [r.getMessage() for r in caplog.records if "writes again" in r.getMessage()]
    assert warnings[0] == (
        f"{metrics}: moved 1 record(s) of step 10 (eval/loss, eval/perplexity), which this run writes again, "
        f"to {moved_to}"
    )
    assert len(warnings) == 3 and not list((tmp_path / "stopped").glob(".*moving"))


def test_tokens_per_second_time_the_training_steps_alone(tmp_path, monkeypatch):
    """An evaluation, BLEU or checkpoint between two log intervals (flushed before it) is not
    counted in the next interval's tokens and steps per second."""
    import types

    import tqdm

    from jaxformer.training import train_metrics as module

    now = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    checkpointer = types.SimpleNamespace(steps=lambda: [], directory=tmp_path / "checkpoints")
    writer = MetricWriter(tmp_path, enabled=True)
    metrics = module.TrainMetrics(writer, checkpointer, tqdm.tqdm(disable=True))
    step = {"loss_sum": 8.0, "nll_sum": 8.0, "correct": 1.0, "weight": 100.0, "learning_rate": 1e-3, "grad_norm": 1.0}
    metrics.add(1, step)
    now[0] += 2.0  # two steps in 2 s
    metrics.add(2, step)
    metrics.flush()
    assert metrics.last["tokens_per_second"] == 100.0 and metrics.last["steps_per_second"] == 1.0
    now[0] += 30.0  # an evaluation
    metrics.restart_interval()
    metrics.add(3, step)
    now[0] += 4.0  # two steps in 4 s
    metrics.add(4, step)
    metrics.flush()
    writer.close()
    assert metrics.last["tokens_per_second"] == 50.0 and metrics.last["steps_per_second"] == 0.5


def test_a_log_interval_split_by_an_interim_checkpoint_writes_the_record_of_one_never_split(tmp_path):
    """A checkpoint saved to stop between log steps stores the interval's summed metrics and writes
    no record; the resumed run goes on from them, and its record at the log step is, value for
    value, that of a run never stopped (times aside)."""
    import types

    import tqdm

    from jaxformer.training.train_metrics import TrainMetrics

    rng = np.random.default_rng(0)
    steps = [
        {
            "loss_sum": np.float32(rng.uniform(100, 900)),
            "nll_sum": np.float32(rng.uniform(100, 900)),
            "correct": np.float32(rng.integers(0, 50)),
            "weight": np.float32(rng.integers(100, 200)),
            "learning_rate": np.float32(step * 1e-4),
            "grad_norm": np.float32(rng.uniform(0.1, 3.0)),
        }
        for step in range(1, 11)
    ]
    checkpointer = types.SimpleNamespace(steps=lambda: [], directory=tmp_path / "checkpoints")

    def records(workdir):
        lines = (workdir / "metrics.jsonl").read_text().splitlines()
        times = ("time", "train/tokens_per_second", "train/steps_per_second")
        return [{key: value for key, value in json.loads(line).items() if key not in times} for line in lines]

    (tmp_path / "straight").mkdir(), (tmp_path / "stopped").mkdir()
    straight = MetricWriter(tmp_path / "straight", enabled=True)
    metrics = TrainMetrics(straight, checkpointer, tqdm.tqdm(disable=True))
    for step, values in enumerate(steps, 1):
        metrics.add(step, values)
    metrics.flush()
    straight.close()

    stopped = MetricWriter(tmp_path / "stopped", enabled=True)
    metrics = TrainMetrics(stopped, checkpointer, tqdm.tqdm(disable=True))
    for step, values in enumerate(steps[:4], 1):
        metrics.add(step, values)
    window = json.loads(json.dumps(metrics.for_checkpoint(interim=True)))  # as the checkpoint's metadata holds it
    assert window["steps"] == 4 and window["last_step"] == 4
    assert metrics.for_checkpoint(interim=True) == {**window, "seconds": pytest.approx(window["seconds"], abs=1)}
    stopped.close()
    assert not (tmp_path / "stopped" / "metrics.jsonl").read_text()  # no record of the partial interval
    resumed = MetricWriter(tmp_path / "stopped", enabled=True, start_step=4)
    metrics = TrainMetrics(resumed, checkpointer, tqdm.tqdm(disable=True), window=window)
    for step, values in enumerate(steps[4:], 5):
        metrics.add(step, values)
    metrics.flush()
    assert records(tmp_path / "stopped") == records(tmp_path / "straight")
    assert [record["step"] for record in records(tmp_path / "straight")] == [10]

    # A scheduled checkpoint (or the run's last) writes the record there, as a run never stopped does.
    metrics.add(11, steps[0])
    assert metrics.for_checkpoint(interim=False) is None and metrics.window is None
    assert metrics.for_checkpoint(interim=True) is None  # nothing since: the interim one stores no window
    resumed.close()
    assert [record["step"] for record in records(tmp_path / "stopped")] == [10, 11]


def test_perplexity_is_exp_of_the_nll_however_large():
    from jaxformer.training.metrics import summarize

    totals = {"loss_sum": 80.0, "nll_sum": 78.0, "correct": 0.0, "weight": 1.0}
    assert summarize(totals)["perplexity"] == pytest.approx(math.exp(78.0))  # was cut off at exp(50)
    assert summarize({**totals, "nll_sum": 78592.3})["perplexity"] == math.inf


def test_a_finished_run_started_again_keeps_its_figures_in_last_metrics(tmp_path):
    """A process that trained no step measured no training or validation figures: the earlier
    ones stay (they were lost, and the summary's validation line with them); a stop recorded
    by the earlier process does not, nor a length it was shortened to on resume (the summary said
    "shortened on resume" again on every run of the same command)."""
    from jaxformer.run.directory import RunDirectory
    from jaxformer.training.metrics import write_last_metrics

    run = RunDirectory(tmp_path)
    finished = {"eval": {"loss": 2.5}, "train": {"loss": 2.0}, "step": 40, "first_step": 20, "stopped_by_signal": 15}
    run.last_metrics_file.write_text(json.dumps(finished))
    again = write_last_metrics(run, {"final": {"chosen": "latest"}, "step": 40, "first_step": 40})
    assert again == {
        "eval": {"loss": 2.5},
        "train": {"loss": 2.0},
        "step": 40,
        "first_step": 40,  # this process's, for its summary: 0 steps
        "final": again["final"],
    }
    # The file keeps the start of the process that trained to step 40.
    assert json.loads(run.last_metrics_file.read_text()) == {**again, "first_step": 20}
    trained = write_last_metrics(run, {"train": {"loss": 1.0}, "step": 60, "first_step": 40})
    assert trained == {"train": {"loss": 1.0}, "step": 60, "first_step": 40}  # its own figures only
    shortened = {"eval": {"loss": 2.5}, "step": 60, "first_step": 60, "shortened_by": "training.num_train_steps=50"}
    run.last_metrics_file.write_text(json.dumps(shortened))
    assert write_last_metrics(run, {"step": 60, "first_step": 60}) == {
        "eval": {"loss": 2.5},
        "step": 60,
        "first_step": 60,
    }
    again_shortened = write_last_metrics(run, {**shortened, "eval": {"loss": 2.0}})  # shortened by this process: said
    assert again_shortened["shortened_by"] == "training.num_train_steps=50"


def test_a_finished_run_started_again_leaves_its_files_as_they_were(tmp_path, caplog):
    """Started again, a finished run trains no step and measures nothing: last_metrics.json is not
    written (its `first_step` and `train_seconds` were those of the process that started again, at
    the end, and a few of its seconds), and no TensorBoard event file is added (one holding only a
    session start was, each time); what a process does write anew is named in the log."""
    from jaxformer.run.directory import RunDirectory
    from jaxformer.training.metrics import write_last_metrics

    run = RunDirectory(tmp_path)
    trained = MetricWriter(tmp_path, enabled=True, start_step=-1)
    trained.write(40, {"loss": 2.0}, prefix="train/")
    trained.close()
    write_last_metrics(run, {"train": {"loss": 2.0}, "step": 40, "train_seconds": 30.0, "first_step": 0})
    files = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in tmp_path.rglob("*") if path.is_file()}

    caplog.set_level(logging.INFO)
    MetricWriter(tmp_path, enabled=True, start_step=40).close()  # as the finished run started again opens it
    again = write_last_metrics(run, {"train": {"loss": 2.0}, "step": 40, "train_seconds": 30.4, "first_step": 40})
    after = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in tmp_path.rglob("*") if path.is_file()}
    assert after == files
    assert again["first_step"] == 40 and again["train_seconds"] == 30.0  # the summary says 0 steps
    assert "last_metrics.json: kept as it was (this run trained no step, and measured nothing anew)" in caplog.text
    write_last_metrics(run, {"final": {"chosen": "latest"}, "step": 40, "first_step": 40})  # a choice made now
    assert "last_metrics.json: final written anew, the rest kept as it was" in caplog.text
    assert json.loads(run.last_metrics_file.read_text())["first_step"] == 0


def test_a_run_killed_after_its_last_checkpoint_takes_its_figures_from_metrics_jsonl(tmp_path):
    """Killed after its last checkpoint, before last_metrics.json was written (or during the final
    choice), the run is started again and trains no step: its last figures are those metrics.jsonl
    recorded at that step, as the process that measured them would have written them."""
    from jaxformer.run.directory import RunDirectory
    from jaxformer.training.metrics import write_last_metrics

    run = RunDirectory(tmp_path)
    writer = MetricWriter(tmp_path, enabled=True, start_step=-1)
    train = {"loss": 2.0, "nll": 1.9, "perplexity": 6.7, "accuracy": 0.4, "learning_rate": 1e-3}
    evaluation = {"loss": 2.5, "nll": 2.4, "perplexity": math.inf, "accuracy": 0.3}
    bleu = {"bleu": 12.5, "chrf": 30.0, "lowercase_bleu": 13.0, "best_bleu": 14.0}
    for step, scale in ((20, 2.0), (40, 1.0)):  # an earlier step's records are not the last figures
        writer.write(step, {key: value * scale for key, value in train.items()}, prefix="train/")
        writer.write(step, {key: value * scale for key, value in evaluation.items()}, prefix="eval/")
        writer.write(step, {key: value * scale for key, value in bleu.items()}, prefix="eval/")
        writer.write(step, {"seconds": 9.0, "end_step": 41.0}, prefix="budget/")
    writer.close()
    (tmp_path / "metrics.rolled_back.jsonl").write_text(json.dumps({"step": 40, "eval/loss": 9.0}) + "\n")
    resumed = MetricWriter(tmp_path, enabled=True, start_step=40)  # as the resumed run opens it
    resumed.close()

    final = {"chosen": "latest", "bleu": 15.0}
    last = write_last_metrics(run, {"final": final, "step": 40, "train_seconds": 9.0, "first_step": 40})
    assert last == {
        "train": train,
        "eval": evaluation,
        "bleu": bleu,
        "final": final,
        "step": 40,
        "train_seconds": 9.0,
        "first_step": 40,
    }
    assert json.loads(run.last_metrics_file.read_text())["eval"]["perplexity"] == "inf"  # as metrics.jsonl has it
    # An earlier last_metrics.json of that step (a finished run started again) is kept as it was.
    run.last_metrics_file.write_text(json.dumps({"eval": {"loss": 2.5}, "step": 40, "first_step": 0}))
    again = write_last_metrics(run, {"step": 40, "train_seconds": 9.0, "first_step": 40})
    assert again["eval"] == {"loss": 2.5} and again["train"] == train and again["bleu"] == bleu
    # A process that trained steps has its own figures only.
    trained = write_last_metrics(run, {"train": {"loss": 1.0}, "step": 40, "first_step": 20})
    assert trained == {"train": {"loss": 1.0}, "step": 40, "first_step": 20}


def test_a_terminal_of_no_width_gets_the_log_lines_not_an_empty_bar(monkeypatch):
    """tqdm draws nothing on a terminal that reports 0 columns (a pseudo-terminal never sized):
    the bar is off there, so the figures come as log lines, as in a redirected log."""
    import os
    import sys
    import types

    from jaxformer.training.train_metrics import progress_bar

    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(fileno=lambda: 2, write=lambda text: None))
    monkeypatch.setattr(os, "get_terminal_size", lambda descriptor: os.terminal_size((0, 0)))
    assert progress_bar(100, 0).disable
    monkeypatch.setattr(os, "get_terminal_size", lambda descriptor: os.terminal_size((120, 40)))
    assert progress_bar(100, 0).disable is None or not progress_bar(100, 0).disable  # tqdm's own test decides


def test_a_new_run_moves_every_record_of_a_start_that_saved_no_checkpoint(tmp_path, caplog):
    """Step 0's evaluation (a fine-tuning start's) included: it was written twice."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(records(6))  # steps 0-5 of a start killed before its first checkpoint
    with caplog.at_level(logging.WARNING):
        MetricWriter(tmp_path, enabled=True, start_step=-1).close()
    assert path.read_bytes() == b"" and (tmp_path / "metrics.rolled_back.jsonl").read_bytes() == records(6)
    assert (
        "moved 6 record(s) of earlier runs with no checkpoint to resume from, which this run trains again"
        in caplog.text
    )


def test_last_metrics_is_strict_json_for_a_diverged_run(tmp_path):
    from jaxformer.run.directory import RunDirectory
    from jaxformer.training.metrics import write_last_metrics

    run = RunDirectory(tmp_path)
    last = write_last_metrics(run, {"eval": {"perplexity": math.inf, "loss": 800.0}, "step": 4, "first_step": 0})
    assert last["eval"]["perplexity"] == math.inf  # the caller's figures stay numbers
    text = run.last_metrics_file.read_text()
    assert "Infinity" not in text and json.loads(text)["eval"] == {"perplexity": "inf", "loss": 800.0}


def test_a_large_perplexity_is_logged_in_three_significant_digits():
    from jaxformer.run.directory import checkpoint_name
    from jaxformer.training.metrics import perplexity_text

    assert perplexity_text(7.1394) == "7.14" and perplexity_text(math.exp(160.8)) == "6.83e+69"
    assert perplexity_text(math.inf) == "inf"
    assert checkpoint_name("best") == "best checkpoint" and checkpoint_name("50") == "checkpoint 50"
