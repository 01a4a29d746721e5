"""The run directory's layout and the checkpoint metadata schema, old checkpoints included."""

import dataclasses
import json
import logging
import os
import pathlib
import shutil

import pytest

from jaxformer.data.tokenizer import TokenizerError
from jaxformer.errors import CheckpointError
from jaxformer.run.checksums import _metadata_digest
from jaxformer.run.directory import CHECKPOINT_KINDS, RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.metadata import CheckpointMetadata
from tests.conftest import make_workdir

METADATA = CheckpointMetadata(
    config={"data": {"name": "multi30k"}},
    model={"preset": "tiny", "vocab_size": 500},
    tokenizer=b"\x0a\x0bproto",
    data_fingerprint="sha256:" + "0" * 64,
    step=7,
)


def test_run_directory_layout(tmp_path):
    run = RunDirectory(str(tmp_path))
    assert run.path == tmp_path and RunDirectory(run) == run and os.fspath(run) == str(tmp_path) == str(run)
    assert pathlib.Path(run) / "x" == tmp_path / "x"
    assert [run.checkpoint_directory(which) for which in CHECKPOINT_KINDS] == [
        tmp_path / "checkpoints",
        tmp_path / "best",
        tmp_path / "averaged",
        tmp_path / "final",
    ]
    assert (run.checkpoints, run.best, run.averaged) == (
        tmp_path / "checkpoints",
        tmp_path / "best",
        tmp_path / "averaged",
    )
    assert run.lock_file == tmp_path / "lock" and run.tokenizer_file == tmp_path / "tokenizer.model"
    assert run.target_tokenizer_file == tmp_path / "tokenizer.target.model"
    assert run.metrics_file == tmp_path / "metrics.jsonl" and run.tensorboard_dir == tmp_path / "tensorboard"
    assert run.last_metrics_file == tmp_path / "last_metrics.json"
    with pytest.raises(ValueError, match="choose one of latest, best, averaged, final or a step number"):
        run.checkpoint_directory("newest")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.path = tmp_path / "other"
    assert not list(tmp_path.iterdir())  # paths only: nothing created


def test_metadata_round_trips_through_json():
    values = json.loads(json.dumps(METADATA.to_json()))
    assert values == {
        "config": METADATA.config,
        "model": METADATA.model,
        "tokenizer": "Cgtwcm90bw==",
        "data_fingerprint": METADATA.data_fingerprint,
        "step": 7,
    }
    assert CheckpointMetadata.from_json(values, "here") == METADATA
    best = METADATA.replace(step=9, bleu=31.25)
    averaged = METADATA.replace(averaged_steps=(5, 6, 7))
    assert CheckpointMetadata.from_json(json.loads(json.dumps(best.to_json())), "here") == best
    assert json.loads(json.dumps(averaged.to_json()))["averaged_steps"] == [5, 6, 7]
    assert CheckpointMetadata.from_json(json.loads(json.dumps(averaged.to_json())), "here") == averaged
    assert METADATA.step == 7 and best.step == 9  # replace makes a copy
    assert METADATA.target_tokenizer is None  # one shared vocabulary: no key written
    separate = METADATA.replace(target_tokenizer=b"\x0a\x0ctarget")
    assert json.loads(json.dumps(separate.to_json()))["target_tokenizer"] == "Cgx0YXJnZXQ="
    assert CheckpointMetadata.from_json(json.loads(json.dumps(separate.to_json())), "here") == separate
    final = METADATA.replace(bleu=30.5, chosen_from="averaged", train_seconds=1834.25, alpha=1.4)
    written = json.loads(json.dumps(final.to_json()))
    assert (written["chosen_from"], written["train_seconds"], written["alpha"]) == ("averaged", 1834.25, 1.4)
    assert CheckpointMetadata.from_json(written, "here") == final
    assert (
        "alpha" not in METADATA.to_json() and CheckpointMetadata.from_json({**written, "alpha": 1}, "here").alpha == 1.0
    )
    with pytest.raises(CheckpointError, match="'train_seconds' holds a JSON string, not a number"):
        CheckpointMetadata.from_json({**written, "train_seconds": "soon"}, "here")
    with pytest.raises(CheckpointError, match="here: key 'alpha' is -0.5, not a length penalty"):
        CheckpointMetadata.from_json({**written, "alpha": -0.5}, "here")
    scored = final.replace(choice_scores={"latest/bleu": 30.0, "alpha_1.4/chrf": 61.25})
    assert CheckpointMetadata.from_json(json.loads(json.dumps(scored.to_json())), "here") == scored
    assert "choice_scores" not in final.to_json()  # older final/ checkpoints read as None
    started = METADATA.replace(started_from="training.init_from: step 40 of /runs/a/checkpoints")
    assert CheckpointMetadata.from_json(json.loads(json.dumps(started.to_json())), "here") == started
    assert "started_from" not in METADATA.to_json()  # a run from scratch, or from before the record: None
    with pytest.raises(CheckpointError, match="here: key 'started_from' holds a JSON integer, not a string"):
        CheckpointMetadata.from_json({**written, "started_from": 40}, "here")
    with pytest.raises(CheckpointError, match="here: key 'choice_scores' holds something other than numbers"):
        CheckpointMetadata.from_json({**written, "choice_scores": {"latest/bleu": "high"}}, "here")
    with pytest.raises(CheckpointError, match="key 'alpha' holds a JSON boolean, not a number"):
        CheckpointMetadata.from_json({**written, "alpha": True}, "here")
    for decision in (True, False):  # R-Drop decided by the run's pace (training/rdrop_start.py)
        decided = METADATA.replace(rdrop_by_pace=decision)
        assert json.loads(json.dumps(decided.to_json()))["rdrop_by_pace"] is decision
        assert CheckpointMetadata.from_json(json.loads(json.dumps(decided.to_json())), "here") == decided
    assert "rdrop_by_pace" not in METADATA.to_json()
    assert CheckpointMetadata.from_json(written, "here").rdrop_by_pace is None
    with pytest.raises(CheckpointError, match="here: key 'rdrop_by_pace' holds a JSON integer, not a boolean"):
        CheckpointMetadata.from_json({**written, "rdrop_by_pace": 1}, "here")
    interim = METADATA.replace(interim=True)  # saved to stop on a signal between scheduled checkpoints
    assert json.loads(json.dumps(interim.to_json()))["interim"] is True and "interim" not in METADATA.to_json()
    assert CheckpointMetadata.from_json(json.loads(json.dumps(interim.to_json())), "here") == interim
    assert CheckpointMetadata.from_json(written, "here").interim is False
    with pytest.raises(CheckpointError, match="here: key 'interim' holds a JSON integer, not a boolean"):
        CheckpointMetadata.from_json({**written, "interim": 1}, "here")
    for last in (True, False):  # saved as its run's last, or before (training/resumed_end.py): either is written
        marked = METADATA.replace(saved_as_last=last)
        assert json.loads(json.dumps(marked.to_json()))["saved_as_last"] is last
        assert CheckpointMetadata.from_json(json.loads(json.dumps(marked.to_json())), "here") == marked
    assert "saved_as_last" not in METADATA.to_json()  # unmarked: from before the mark, its run's end inferred
    assert CheckpointMetadata.from_json(written, "here").saved_as_last is None
    with pytest.raises(CheckpointError, match="here: key 'saved_as_last' holds a JSON string, not a boolean"):
        CheckpointMetadata.from_json({**written, "saved_as_last": "true"}, "here")


def test_an_interim_checkpoint_keeps_the_metrics_of_its_unlogged_steps():
    """A checkpoint saved to stop between log steps holds those steps' summed metrics, which the
    resumed run goes on from (training/train_metrics.py); older checkpoints have none."""
    window = {
        "steps": 4,
        "last_step": 34,
        "sums": {"loss_sum": 812.5, "nll_sum": 900.25, "correct": 12.0, "weight": 170.0, "grad_norm": 3.5},
        "learning_rate": 0.002,
        "seconds": 0.4,
    }
    interim = METADATA.replace(interim=True, train_window=window)
    written = json.loads(json.dumps(interim.to_json()))
    assert written["train_window"] == window and "train_window" not in METADATA.to_json()
    assert CheckpointMetadata.from_json(written, "here") == interim
    assert CheckpointMetadata.from_json(METADATA.to_json(), "here").train_window is None
    for damaged in ({**window, "steps": 0}, {**window, "sums": {"loss_sum": 1.0}}, {**window, "seconds": "0.4"}):
        with pytest.raises(CheckpointError, match="^here: key 'train_window' is not the metrics of a log interval"):
            CheckpointMetadata.from_json({**written, "train_window": damaged}, "here")


def test_metadata_from_older_and_newer_writers():
    old = {"config": {}, "model": {}, "tokenizer": "AAAA", "step": 3, "checksums": {"format": 1}}  # before fingerprints
    metadata = CheckpointMetadata.from_json(old, "old")
    assert metadata.data_fingerprint is None and metadata.tokenizer == b"\0\0\0" and metadata.bleu is None
    assert CheckpointMetadata.from_json({**old, "bleu": 20, "written_by": "a later version"}, "new").bleu == 20.0
    assert metadata.target_tokenizer is None  # checkpoints from before separate vocabularies: shared
    assert CheckpointMetadata.from_json({**old, "target_tokenizer": None}, "old").target_tokenizer is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": None}, "key 'model' is missing"),
        ({"step": "3"}, "key 'step' holds a JSON string, not an integer"),
        ({"step": True}, "key 'step' holds a JSON boolean, not an integer"),
        ({"config": [1]}, "key 'config' holds a JSON array, not an object"),
        ({"tokenizer": 12}, "key 'tokenizer' holds a JSON integer, not a base64 string"),
        ({"tokenizer": "not base64!"}, "key 'tokenizer' is not valid base64"),
        ({"target_tokenizer": 12}, "key 'target_tokenizer' holds a JSON integer, not a base64 string"),
        ({"target_tokenizer": "not base64!"}, "key 'target_tokenizer' is not valid base64"),
        ({"data_fingerprint": 5}, "key 'data_fingerprint' holds a JSON integer, not a string"),
        ({"bleu": "high"}, "key 'bleu' holds a JSON string, not a number"),
        ({"averaged_steps": [1, "2"]}, "key 'averaged_steps' holds something other than integer steps"),
    ],
)
def test_bad_metadata_names_the_file_and_the_key(change, message):
    values = METADATA.to_json()
    for key, value in change.items():
        if value is None:
            del values[key]
        else:
            values[key] = value
    with pytest.raises(CheckpointError, match=f"^/runs/a/checkpoints/7/metadata/metadata: {message}; not a jaxformer"):
        CheckpointMetadata.from_json(values, "/runs/a/checkpoints/7/metadata/metadata")
    with pytest.raises(CheckpointError, match="holds a JSON array, not an object"):
        CheckpointMetadata.from_json([values], "somewhere")


# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("metadata")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir, _, tokenizer = make_workdir(tmp_path_factory.mktemp("metadata") / "run", steps=(5,))
    return pathlib.Path(workdir), tokenizer


def test_metadata_helpers_build_the_model_config_and_tokenizer(run):
    workdir, tokenizer = run
    step, metadata, params = load_checkpoint(workdir, params=False)
    assert step == 5 and params is None
    assert metadata.model_config().vocab_size == tokenizer.vocab_size == metadata.model_config().to_dict()["vocab_size"]
    assert metadata.load_tokenizer().model_proto == tokenizer.model_proto
    assert metadata.load_target_tokenizer().model_proto == tokenizer.model_proto  # shared: the same model
    assert metadata.model_config().source_vocab_size is None


def test_separate_target_tokenizer_is_loaded_from_the_metadata(run):
    from jaxformer.data.tokenizer import train_tokenizer
    from tests.conftest import read_raw

    target = train_tokenizer(read_raw("train.de.gz", 1000), vocab_size=200)
    metadata = METADATA.replace(tokenizer=run[1].model_proto, target_tokenizer=target.model_proto)
    assert metadata.load_tokenizer().model_proto == run[1].model_proto
    assert metadata.load_target_tokenizer().model_proto == target.model_proto
    with pytest.raises(TokenizerError):
        METADATA.replace(target_tokenizer=b"\0\0\0").load_target_tokenizer()


@pytest.mark.parametrize("checksummed", [True, False])
def test_checkpoints_written_by_the_previous_code_still_load(run, tmp_path, caplog, checksummed):
    """Plain dicts (no "data_fingerprint", a list of averaged steps), with or without checksums."""
    workdir = pathlib.Path(shutil.copytree(run[0], tmp_path / "run"))
    path = RunDirectory(workdir).checkpoints / "5" / "metadata" / "metadata"
    written = json.loads(path.read_text())
    old = {key: written[key] for key in ("config", "model", "tokenizer")}
    old.update(step=5, averaged_steps=[3, 4, 5])
    if checksummed:
        old["checksums"] = {**written["checksums"], "metadata": _metadata_digest(old)}
    path.write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING):
        step, metadata, params = load_checkpoint(workdir)
    assert step == 5 and params is not None
    assert metadata.data_fingerprint is None and metadata.averaged_steps == (3, 4, 5)
    assert metadata.load_tokenizer().model_proto == run[1].model_proto
    assert any("no checksums" in record.getMessage() for record in caplog.records) != checksummed


def test_a_checkpoints_metadata_reads_the_identity_of_its_parameters_and_a_start_records_it(tmp_path):
    from jaxformer.run.checkpoint import Checkpointer

    def identities(workdir):
        checkpointer = Checkpointer(RunDirectory(workdir).checkpoints, keep=None, read_only=True)
        return {step: checkpointer.read_metadata(step).params_digest for step in checkpointer.steps()}

    # Other parameters, another identity; the same parameters saved by another run, the same one.
    first, _, _ = make_workdir(tmp_path / "a", steps=(1, 2), scale=lambda step: float(step))
    again, _, _ = make_workdir(tmp_path / "b", steps=(1,))
    read = identities(first)
    assert len(read[1]) == 32 and read[1] != read[2] and identities(again) == {1: read[1]}
    assert read[1] not in json.dumps(json.loads((first / "checkpoints" / "1" / "metadata" / "metadata").read_text()))
    metadata = Checkpointer(RunDirectory(first).checkpoints, keep=None, read_only=True).read_metadata(1)
    assert metadata.replace(step=3).params_digest is None  # no longer what checkpoint 1 holds
    # A checkpoint of an older jaxformer, saved without checksums: no identity.
    path = first / "checkpoints" / "2" / "metadata" / "metadata"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "checksums"}))
    assert identities(first)[2] is None

    # The record of a run's start: written, read back; absent from runs from scratch or from before it.
    started = METADATA.replace(
        started_from="training.init_from: step 40 of /runs/a/checkpoints",
        started_from_params={"training.init_from": read[1]},
    )
    assert CheckpointMetadata.from_json(json.loads(json.dumps(started.to_json())), "here") == started
    assert "started_from_params" not in METADATA.to_json()
    written = METADATA.to_json()
    with pytest.raises(CheckpointError, match="here: key 'started_from_params' holds a JSON array, not an object"):
        CheckpointMetadata.from_json({**written, "started_from_params": [read[1]]}, "here")
    with pytest.raises(CheckpointError, match="here: key 'started_from_params' holds something other than strings"):
        CheckpointMetadata.from_json({**written, "started_from_params": {"training.init_from": 7}}, "here")
