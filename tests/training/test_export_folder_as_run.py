"""An export's folder (jaxformer-export's output) given where a training run is expected: as
training.init_from, or as translate's, evaluate's and export's --workdir. Each is named an export,
with the run and checkpoint to give instead."""

import json

import pytest

from jaxformer.errors import CheckpointError
from jaxformer.export import standalone
from jaxformer.run.export_origin import EXPORT_FORMAT, EXPORT_LOADER
from jaxformer.run.loading import load_checkpoint
from jaxformer.training.init_from import load_starting_points
from tests.training.test_init_from import tiny_config


def test_an_export_is_named_with_the_run_it_was_exported_from(tmp_path):
    """An export's folder (jaxformer-export's output) was 'not a jaxformer workdir', or, named final or
    best, said to hold no checkpoint. It is named an export, with the run and checkpoint its config.json
    records as the start to give instead, in one line."""
    assert (EXPORT_FORMAT, EXPORT_LOADER) == (standalone.FORMAT, standalone.LOADER_FILE)
    training = tiny_config(".").training
    runs = tmp_path / "runs"
    for folder, which, suggested in (
        ("export", "latest", "training.init_checkpoint=150"),  # the step exported: latest has moved on since
        ("final", "best", "training.init_checkpoint=best"),
        ("best", 150, "training.init_checkpoint=150"),
    ):
        export = tmp_path / folder
        export.mkdir()
        recorded = {"workdir": str(runs), "which": which, "step": 150}
        (export / "config.json").write_text(json.dumps({"format": standalone.FORMAT, "checkpoint": recorded}))
        training.init_from = str(export)
        with pytest.raises(CheckpointError) as error:
            load_starting_points(training)
        assert str(error.value) == (
            f"training.init_from: {export} is an export (jaxformer-export's folder: parameters in decoding form "
            "for its program, without a checkpoint's run config), not a training run; start from the run it was "
            f"exported from: training.init_from={runs} {suggested}"
        )
    (export / "config.json").write_text("{")  # damaged: serve.py beside it still says what the folder is
    (export / standalone.LOADER_FILE).write_text("")
    training.init_from, training.init_checkpoint = None, "5"
    training.init_decoder_from = str(export)
    with pytest.raises(CheckpointError) as error:
        load_starting_points(training)
    assert str(error.value).startswith(f"training.init_decoder_from (training.init_checkpoint='5'): {export} is an ")
    assert str(error.value).endswith("; start from the training run it was exported from (its config.json names none)")


def test_an_export_given_as_a_workdir_is_named_with_the_run_to_give(tmp_path):
    """translate, evaluate and export given an export's folder for --workdir said 'not a jaxformer
    workdir' (or, for one named final, that it was a workdir's final/ folder); they name it an export,
    its serve.py, and the run and checkpoint its config.json records."""
    runs = tmp_path / "runs"
    for folder, recorded, give in (
        (
            "exports",
            {"workdir": str(runs), "which": "latest", "step": 150},
            f"the run it was exported from, --workdir {runs} --checkpoint 150",
        ),
        (
            "final",
            {"workdir": str(runs), "which": "final", "step": 150},
            f"the run it was exported from, --workdir {runs} --checkpoint final",
        ),
        ("other", None, "the training run it was exported from (its config.json names none)"),
    ):
        export = tmp_path / folder
        export.mkdir()
        (export / "config.json").write_text(json.dumps({"format": standalone.FORMAT, "checkpoint": recorded}))
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(str(export), "latest")
        assert str(error.value).startswith(f"{export} is an export (jaxformer-export's folder")
        assert str(error.value).endswith(f": serve it with python {export / standalone.LOADER_FILE}, or give {give}")
