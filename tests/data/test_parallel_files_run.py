"""data.name = "parallel_files" end to end (slow): the README's "Your own data" command trained on
generated French and Japanese files with the tiny model; the run then evaluates and translates,
resumes on the same files moved elsewhere, and is refused on edited ones."""

import json
import logging
import logging.handlers
import shlex
import shutil

import numpy as np
import pytest
import sacrebleu

from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import get_builder
from tests.data.parallel_corpus import pairs, read, write_text_files, write_tsv

# -- a tiny run trained on such files, as the README's command says --------------------------------

# The README's example ("Your own data"), word for word: its overrides are the ones trained below.
README_COMMAND = (
    "jaxformer-train --config parallel_files --workdir runs/fr-ja "
    "--config.data.source_language=fr --config.data.target_language=ja "
    "--config.data.files.train='corpus/train.{lang}.gz' --config.data.files.test=corpus/test.tsv"
)
# What the test adds: the tiny config (made for multi30k) on the same data, trained for seconds.
TINY_RUN = [
    ("data.name", "parallel_files"),
    ("data.batch_size", "8"),  # one row per simulated device
    ("tokenizer.vocab_size", "100"),  # what 300 generated pairs allow
    ("training.num_train_steps", "4"),
    ("training.eval_every_steps", "4"),
    ("training.checkpoint_every_steps", "4"),
]


@pytest.mark.slow  # to the slow set (about 33 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_the_readme_command_trains_on_own_files_and_the_run_translates(tmp_path, monkeypatch):
    from jaxformer.commands import evaluate
    from jaxformer.decoding.generate import DecodeSettings
    from jaxformer.decoding.translator import Translator
    from jaxformer.run.loading import load_checkpoint
    from jaxformer.training import experiment
    from jaxformer.training.config_file import apply_overrides, load_config, split_overrides
    from jaxformer.training.loop import train_and_evaluate

    monkeypatch.chdir(tmp_path)  # the command's relative paths are taken from here
    write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 1300))  # 1,000 held out for validation
    test_pairs = pairs(1300, 10)
    write_tsv(tmp_path / "corpus" / "test.tsv", [*test_pairs[:3], ("", "vide"), *test_pairs[3:], ("vide", "")])
    overrides, rest = split_overrides(shlex.split(README_COMMAND)[1:])
    assert rest == ["--config", "parallel_files", "--workdir", "runs/fr-ja"]
    prepared_in = [("data.data_dir", str(tmp_path / "tfds"))]  # not ~/tensorflow_datasets
    shipped = load_config("parallel_files")
    apply_overrides(shipped, overrides + prepared_in)
    experiment.validate(shipped)

    config = load_config("tiny")
    apply_overrides(config, overrides + prepared_in + TINY_RUN)
    for key in ("name", "source_language", "target_language", "files", "validation_holdout", "shuffle_seed"):
        assert config.data[key] == shipped.data[key], key  # the data the README's command prepares
    last = train_and_evaluate(config, rest[3])
    assert last["step"] == 4 and np.isfinite(last["train"]["loss"]) and np.isfinite(last["eval"]["loss"])

    workdir = tmp_path / "runs" / "fr-ja"
    shutil.copytree(tmp_path / "corpus", tmp_path / "moved")  # the same files, elsewhere (for the resume below)
    step, metadata, _ = load_checkpoint(workdir, "latest", params=False)
    assert step == 4 and sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["4"]
    shipped_data = get_builder(shipped.data)  # the README's data: what the run was trained on
    assert metadata.data_fingerprint == shipped_data.fingerprint
    assert len(read(shipped_data, "train")) == 300 and len(read(shipped_data, "validation")) == 1000

    # What evaluate.py --split test scores: the test file, read through the checkpoint's data section.
    # Its lines with an empty side are not pairs: they are not scored, and --output keeps their lines.
    tokenizers = (metadata.load_tokenizer(), metadata.load_target_tokenizer())
    sources, references, file_lines = evaluate.split_pairs(str(workdir), "test", None, tokenizers)
    assert list(zip(sources, references)) == test_pairs
    assert file_lines == evaluate.FileLines([1, 2, 3, *range(5, 12)], 12)
    assert evaluate.split_pairs(str(workdir), "test", 3, tokenizers)[2] is None  # its first 3 lines are all pairs
    assert evaluate.split_pairs(str(workdir), "test", 4, tokenizers)[2] == evaluate.FileLines([1, 2, 3, 5], 5)
    flags = ["--workdir", str(workdir), "--split", "test", "--method", "greedy", "--no_progress", "--output"]
    assert evaluate.main([*flags, "hyp.ja", "--json", "scores.json"]) == 0
    written = (tmp_path / "hyp.ja").read_text().split("\n")
    assert len(written) == 13 and written[3] == written[11] == written[12] == ""  # 12 lines, each ended
    scored = [line for number, line in enumerate(written[:12], start=1) if number not in (4, 12)]
    # Japanese BLEU as sacreBLEU scores Japanese (ja-mecab, the dev extra's): 13a would see a token a sentence.
    bleu = sacrebleu.BLEU(trg_lang="ja")
    expected = bleu.corpus_score(scored, [[target for _, target in test_pairs]]).score
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["bleu"] == pytest.approx(expected) and scores["bleu_signature"] == str(bleu.get_signature())
    assert "|tok:ja-mecab-" in scores["bleu_signature"]
    # ... and only while the files are the ones the run was trained on: edited, its holdout would move.
    write_text_files(tmp_path / "corpus" / "train.{lang}.gz", pairs(0, 1301))
    with pytest.raises(DataError, match=r"runs/fr-ja was trained on other data files \(fingerprint sha256:"):
        evaluate.split_pairs(str(workdir), "validation", None, tokenizers)
    translator = Translator.from_workdir(workdir, settings=DecodeSettings(method="greedy", max_extra_length=8))
    outputs = translator.translate(sources[:4])
    assert translator.step == 4 and len(outputs) == 4 and all(isinstance(output, str) for output in outputs)

    # The run resumes from the same files moved elsewhere and named another way (their contents,
    # not their paths, are the run's), the change logged; the edited ones are refused.
    moved = [("data.files.train", "corpus/../moved/train.{lang}.gz"), ("data.files.test", "moved/test.tsv")]
    longer = [("training.num_train_steps", "6")]
    config = load_config("tiny")
    apply_overrides(config, overrides + prepared_in + TINY_RUN + moved + longer)
    logged = logging.handlers.BufferingHandler(10_000)  # evaluate.main above set up the root logger's handlers
    logging.getLogger().addHandler(logged)
    try:
        assert train_and_evaluate(config, rest[3])["step"] == 6
    finally:
        logging.getLogger().removeHandler(logged)
    moved_train = f"data.files.train: '{tmp_path}/corpus/train.{{lang}}.gz' -> '{tmp_path}/moved/train.{{lang}}.gz'"
    assert any(moved_train in record.getMessage() for record in logged.buffer if record.levelno == logging.WARNING)
    config = load_config("tiny")
    apply_overrides(config, overrides + prepared_in + TINY_RUN + [("training.num_train_steps", "8")])
    with pytest.raises(DataError, match=r"runs/fr-ja was trained on other data files"):
        train_and_evaluate(config, rest[3])
