"""The run's automatic final choice among the latest, best and averaged parameters, checked
against translating each candidate through Translator and scoring it with sacreBLEU."""

import dataclasses
import json

import pytest
import sacrebleu

from jaxformer.data.pipeline import record_text
from jaxformer.data.sources import get_builder, load_split
from jaxformer.decoding.translator import Translator
from jaxformer.run.averaging import average_last
from jaxformer.run.loading import load_checkpoint
from jaxformer.training.experiment import with_absolute_paths
from jaxformer.training.validation_bleu import decode_settings
from tests.training.test_loop import ROOT, losses, train

pytestmark = pytest.mark.xdist_group("final-choice")

CHOICE = (
    "--config.training.final_choice=True",
    "--config.training.average_last=2",
    "--config.training.bleu_every_steps=20",
    "--config.training.bleu_examples=16",
    "--config.training.bleu_method=greedy",  # during training; the final choice searches with `decoding`
    "--config.decoding.beam_size=2",
    "--config.decoding.max_extra_length=8",
)


def test_the_run_saves_the_candidate_with_the_highest_validation_bleu(data_dir, tmp_path):
    workdir = tmp_path / "run"
    first = train(workdir, data_dir, *CHOICE)
    summary = json.loads((workdir / "last_metrics.json").read_text())["final"]
    assert {"latest/bleu", "averaged/bleu"} <= set(summary)
    step, metadata, _ = load_checkpoint(workdir, "final")
    assert step == 40 and metadata.chosen_from == summary["chosen"] and metadata.bleu == summary["bleu"]
    assert summary["bleu"] == max(value for key, value in summary.items() if key.endswith("/bleu"))
    assert "final choice at step 40" in first.stderr
    assert f"final choice: {summary['chosen']} (validation BLEU {summary['bleu']:.2f})" in first.stderr  # the summary
    assert f"--workdir {workdir.absolute()} --checkpoint final" in first.stderr  # its translate command

    # Each candidate scored independently: translated by a Translator loaded from the workdir.
    config = with_absolute_paths(_config(data_dir))
    validation = load_split(get_builder(config.data), "validation", ("en", "de"))
    records = validation.__getitems__(list(range(config.data.max_eval_examples)))
    sources = [record_text(record, "en") for record in records]
    references = [record_text(record, "de") for record in records]
    average_last(workdir, 2)  # the same mean, written to averaged/ for the Translator to load
    translator = Translator.from_workdir(workdir, "final", decode_settings(config), batch_size=64)

    def bleu(checkpoint, translator=translator, count=None):
        params = load_checkpoint(workdir, checkpoint)[2]
        hypotheses = translator.with_params(params).translate(sources[:count])
        return sacrebleu.corpus_bleu(hypotheses, [references[:count]]).score

    for name in ("latest", "averaged", "best"):
        if f"{name}/bleu" in summary:
            assert bleu(name) == pytest.approx(summary[f"{name}/bleu"], abs=1e-6), name
    assert bleu("final") == pytest.approx(summary["bleu"], abs=1e-6)

    # Validation BLEU during training searched greedily: step 20's logged BLEU is greedy's.
    greedy = Translator.from_workdir(workdir, 20, dataclasses.replace(decode_settings(config), method="greedy"))
    assert bleu(20, greedy, 16) == pytest.approx(losses(workdir, "eval/bleu")[20], abs=1e-6)


def _config(data_dir):
    from jaxformer.training.config_file import load_config

    config = load_config(str(ROOT / "jaxformer" / "configs" / "tiny.py"))
    config.data.data_dir = str(data_dir)
    config.decoding.beam_size, config.decoding.max_extra_length = 2, 8
    return config
