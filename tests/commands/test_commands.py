"""evaluate and average_checkpoints, run as a user runs them (translate: test_translate_command.py)."""

import argparse
import json
import re
import shutil
import sys

import jax
import numpy as np
import pytest
import sacrebleu

from jaxformer.commands import average_checkpoints, evaluate
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.errors import EXIT_USER_ERROR, CheckpointError
from jaxformer.run.loading import load_checkpoint
from tests.conftest import make_workdir, read_raw

pytestmark = pytest.mark.xdist_group("decoding-workdir")
FAST = ["--method", "greedy", "--max_extra_length", "6"]


def translate_settings():
    from jaxformer.decoding.generate import DecodeSettings

    return DecodeSettings(method="greedy", max_extra_length=6)


def test_evaluate_scores_files_like_sacrebleu(decoding_workdir, tmp_path, capsys):
    sources, references = read_raw("val.en.gz", 30), read_raw("val.de.gz", 30)
    source, reference = tmp_path / "val.en", tmp_path / "val.de"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    hypotheses, scores_file = tmp_path / "hyp.de", tmp_path / "scores.json"
    evaluate.main(
        [
            "--workdir",
            str(decoding_workdir),
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--output",
            str(hypotheses),
            "--json",
            str(scores_file),
            *FAST,
        ]
    )
    printed = capsys.readouterr().out
    scores = json.loads(scores_file.read_text())
    outputs = hypotheses.read_text().splitlines()
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(outputs, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(outputs, [references]).score)
    assert scores["lowercase_bleu"] == pytest.approx(sacrebleu.corpus_bleu(outputs, [references], lowercase=True).score)
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in printed and "chrF" in printed


class LineBreakingTranslator:
    """Translations holding line breaks, as a byte-fallback tokenizer's <0x0A> or <0x0D> decodes."""

    settings, step = DecodeSettings(method="greedy"), 1

    def translate(self, sentences, progress, line_numbers=None):
        return [f"{sentence}\n{index}\r\nzwei\rdrei" for index, sentence in enumerate(sentences)]


def test_evaluate_writes_one_output_line_per_source_line_as_translate_does(
    decoding_workdir, tmp_path, capsys, monkeypatch
):
    sources, references = read_raw("val.en.gz", 4), read_raw("val.de.gz", 4)
    sources[1] = ""  # left out of the scores, an empty line in --output
    source, reference, hypotheses = tmp_path / "val.en", tmp_path / "val.de", tmp_path / "hyp.de"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    monkeypatch.setattr(evaluate, "translator_from_flags", lambda *args: LineBreakingTranslator())
    files = ["--source", str(source), "--reference", str(reference), "--output", str(hypotheses)]
    scores_file = tmp_path / "scores.json"
    assert evaluate.main(["--workdir", str(decoding_workdir), *files, "--json", str(scores_file), *FAST]) == 0
    outputs = hypotheses.read_text().split("\n")[:-1]
    translated = [s for s in sources if s]
    expected = [f"{translated[0]} 0 zwei drei", "", f"{translated[1]} 1 zwei drei", f"{translated[2]} 2 zwei drei"]
    assert outputs == expected
    scored = [outputs[0], *outputs[2:]]
    scores = json.loads(scores_file.read_text())
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(scored, [references[:1] + references[2:]]).score)


class EchoingTranslator:
    """Each sentence as its own translation, searched with the settings the flags name."""

    step = 1

    def __init__(self, settings):
        self.settings = settings

    def translate(self, sentences, progress, line_numbers=None):
        return list(sentences)


@pytest.mark.parametrize(
    ("flags", "recorded"),
    [
        (["--method", "greedy"], {}),
        (["--method", "beam", "--beam_size", "2"], {"beam_size": 2}),
        (["--method", "sample", "--seed", "5", "--batch_size", "3"], {"seed": 5, "batch_size": 3}),
    ],
)
def test_evaluate_json_records_the_settings_that_chose_the_outputs(
    flags, recorded, decoding_workdir, tmp_path, monkeypatch
):
    source, reference, scores_file = tmp_path / "val.en", tmp_path / "val.de", tmp_path / "scores.json"
    source.write_text("\n".join(read_raw("val.en.gz", 4)) + "\n")
    reference.write_text("\n".join(read_raw("val.de.gz", 4)) + "\n")
    monkeypatch.setattr(evaluate, "translator_from_flags", lambda args, settings, *rest: EchoingTranslator(settings))
    files = ["--source", str(source), "--reference", str(reference), "--json", str(scores_file)]
    assert evaluate.main(["--workdir", str(decoding_workdir), *files, *flags, "--max_extra_length", "7"]) == 0
    scores = json.loads(scores_file.read_text())
    assert scores["method"] == flags[1] and scores["max_extra_length"] == 7  # every method's outputs stop there
    assert {key: scores[key] for key in recorded} == recorded
    assert ("batch_size" in scores) == (flags[1] == "sample")  # beam and greedy search give each sentence alike


def test_evaluate_scores_bleu_with_the_tokenizer_named_and_refuses_one_it_cannot_build_first(
    decoding_workdir, tmp_path, capsys, monkeypatch
):
    sources, references = read_raw("val.en.gz", 10), read_raw("val.de.gz", 10)
    source, reference = tmp_path / "val.en", tmp_path / "val.de"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    hypotheses, scores_file = tmp_path / "hyp.de", tmp_path / "scores.json"
    files = ["--source", str(source), "--reference", str(reference), "--output", str(hypotheses)]
    arguments = ["--workdir", str(decoding_workdir), *files, "--json", str(scores_file), *FAST]
    monkeypatch.setattr("sacrebleu.tokenizers.tokenizer_ja_mecab.MeCab", None)  # as without the ja extra
    read = evaluate.file_pairs
    monkeypatch.setattr(evaluate, "file_pairs", lambda *args: pytest.fail("the files were read first"))
    capsys.readouterr()
    assert evaluate.main([*arguments, "--bleu_tokenize", "ja-mecab"]) == EXIT_USER_ERROR
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: BLEU of target language 'de' is scored with sacreBLEU's 'ja-mecab' tokenizer, ")
    assert line.endswith(
        "install it with pip install 'jaxformer[ja]', or name another tokenizer with --bleu_tokenize (e.g. 'char')"
    )
    assert not hypotheses.exists() and not scores_file.exists()
    monkeypatch.setattr(evaluate, "file_pairs", read)
    assert evaluate.main([*arguments, "--bleu_tokenize", "char"]) == 0
    printed, scores = capsys.readouterr().out, json.loads(scores_file.read_text())
    outputs = hypotheses.read_text().splitlines()
    for lowercase, key in ((False, "bleu"), (True, "lowercase_bleu")):
        bleu = sacrebleu.BLEU(tokenize="char", lowercase=lowercase)
        assert scores[key] == pytest.approx(bleu.corpus_score(outputs, [references]).score)
        assert scores[f"{key}_signature"] == str(bleu.get_signature())
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(outputs, [references]).score)
    assert "|tok:char|" in printed
    # Without the flag: the run's training.bleu_tokenize, else sacreBLEU's choice for its target language.
    run = {"data": {"target_language": "zh"}, "training": {"bleu_tokenize": None}}
    no_flag, flag = argparse.Namespace(bleu_tokenize=None), argparse.Namespace(bleu_tokenize="intl")
    assert [evaluate.bleu_tokenize(no_flag, run), evaluate.bleu_tokenize(flag, run)] == ["zh", "intl"]
    run["training"]["bleu_tokenize"] = "char"
    assert [evaluate.bleu_tokenize(no_flag, run), evaluate.bleu_tokenize(flag, run)] == ["char", "intl"]
    assert evaluate.bleu_tokenize(no_flag, {"data": {"target_language": "zh"}, "training": {}}) == "zh"  # older run


@pytest.mark.slow  # to the slow set (about 9 s): the default suite ran 10 min 28 s on a 2-core Intel VM (2026-12-06)
def test_evaluate_a_split_of_the_runs_dataset(decoding_workdir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the progress bar is drawn on a terminal only
    evaluate.main(
        [
            "--workdir",
            str(decoding_workdir),
            "--split",
            "test_2016_flickr",
            "--max_examples",
            "12",
            "--json",
            str(tmp_path / "s.json"),
            *FAST,
        ]
    )
    scores = json.loads((tmp_path / "s.json").read_text())
    assert scores["sentences"] == 12 and scores["data"] == "test_2016_flickr"
    assert scores["method"] == "greedy" and not {"beam_size", "alpha", "stop", "temperature"} & set(scores)
    assert "translate: 100%" in capsys.readouterr().err  # the progress bar, unless --no_progress:
    arguments = ["--workdir", str(decoding_workdir), "--split", "test_2016_flickr", "--max_examples", "3", *FAST]
    assert evaluate.main([*arguments, "--no_progress"]) == 0
    assert "translate:" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)  # ... or where stderr is a file or a pipe
    assert evaluate.main(arguments) == 0
    assert "translate:" not in capsys.readouterr().err
    capsys.readouterr()
    assert evaluate.main(["--workdir", str(decoding_workdir), "--split", "test_2099", *FAST]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if " I " not in line]  # the info logs aside
    assert len(errors) == 1 and errors[0].startswith(
        "error: --split test_2099: dataset 'multi30k' has no split 'test_2099'"
    )


def test_evaluate_rejects_misaligned_files(decoding_workdir, tmp_path, capsys):
    (tmp_path / "a").write_text("one\ntwo\n")
    (tmp_path / "b").write_text("eins\n")
    assert (
        evaluate.main(
            ["--workdir", str(decoding_workdir), "--source", str(tmp_path / "a"), "--reference", str(tmp_path / "b")]
        )
        == 2
    )
    assert "error: line counts differ" in capsys.readouterr().err


def test_evaluate_leaves_out_file_pairs_with_an_empty_side_as_a_split_does(
    decoding_workdir, tmp_path, capsys, monkeypatch
):
    sources, references = read_raw("val.en.gz", 10), read_raw("val.de.gz", 10)
    sources[2], references[4] = "", "  "  # line 3's source, line 5's reference
    sources[5] = " ".join(read_raw("val.en.gz", 4))  # over 32 tokens: translated in pieces, with a warning
    # Sides that encode to no piece are empty too, as translate reads them: not scored as empty outputs.
    sources[1], sources[7], references[8] = "\u200b", "\x07", "\ufeff\u200b"
    source, reference = tmp_path / "t.en", tmp_path / "t.de"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    hypotheses, scores_file = tmp_path / "hyp.de", tmp_path / "scores.json"
    files = ["--source", str(source), "--reference", str(reference)]
    arguments = ["--workdir", str(decoding_workdir), *files, "--output", str(hypotheses), "--json", str(scores_file)]
    assert evaluate.main([*arguments, "--max_source_tokens", "32", *FAST]) == 0
    scores = json.loads(scores_file.read_text())
    outputs = hypotheses.read_text().splitlines()
    left_out = (1, 2, 4, 7, 8)
    assert len(outputs) == 10 and all(outputs[index] == "" for index in left_out)  # one line per line of the files
    kept = [index for index in range(10) if index not in left_out]
    assert scores["sentences"] == 5
    scored = [outputs[index] for index in kept]
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(scored, [[references[i] for i in kept]]).score)
    err = capsys.readouterr().err
    said = f"skipped 5 pairs with an empty side in the first 10 lines of {source} / {reference} (first at {source}:2)"
    said_lines = [line for line in err.splitlines() if "empty side" in line]  # the reader's warning is off
    assert len(said_lines) == 1 and said_lines[0].endswith(f"{said}: --output writes them as empty lines"), err
    assert re.search(r" W sentence 3 \(line 6\) has \d+ tokens, more than max_source_tokens=32", err), err

    class NoModel:  # files without a pair are refused before the model is read
        @staticmethod
        def from_workdir(*args, **kwargs):
            raise AssertionError("the model was read")

        check_workdir = Translator.check_workdir

    monkeypatch.setattr("jaxformer.decoding.translator.Translator", NoModel)
    for text in ("", "\n\n"):
        source.write_text(text)
        reference.write_text(text)
        assert evaluate.main(["--workdir", str(decoding_workdir), *files, *FAST]) == 2
        error = capsys.readouterr().err.splitlines()[-1]
        assert error == f"error: {source} and {reference}: no pair with text on both sides, nothing to score"


def test_an_unknown_split_is_refused_before_the_data_is_prepared(decoding_workdir, tmp_path, capsys, monkeypatch):
    """... and before the checkpoint's parameters are read: multi30k's splits are known from its metadata."""
    from jaxformer.data import sources

    def no_preparation(builder):
        raise AssertionError("the dataset was prepared")

    def no_parameters(*arguments, before_params, **keywords):
        def checked(metadata):
            before_params(metadata)
            raise AssertionError("the split was not checked before the checkpoint's parameters were read")

        return load_checkpoint(*arguments, before_params=checked, **keywords)

    monkeypatch.setattr(sources, "prepare", no_preparation)
    monkeypatch.setattr(evaluate, "load_checkpoint", no_parameters)
    assert evaluate.main(["--workdir", str(decoding_workdir), "--split", "nosuch", *FAST]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        "error: --split nosuch: dataset 'multi30k' has no split 'nosuch'; it has train, validation, test_2016_flickr"
    )


def test_evaluate_a_split_needs_only_its_own_files(tmp_path, capsys):
    """The run's other files gone (its training files deleted): the split is read from the copy
    prepared from them all; its own file gone, one line names it."""
    from jaxformer.data.sources import get_builder
    from jaxformer.training.experiment import default_config
    from tests.data.test_sources import write_raw_corpus

    raw = write_raw_corpus(tmp_path / "raw")
    data = default_config().data
    data.data_dir, data.raw_dir = str(tmp_path / "tfds"), str(raw)
    trained = get_builder(data)
    trained.download_and_prepare()
    run = {"raw_dir": str(raw)}
    workdir = make_workdir(tmp_path / "run", tmp_path / "tfds", data=run, data_fingerprint=trained.fingerprint)[0]
    (raw / "train.en.gz").unlink()
    (raw / "val.de.gz").unlink()
    arguments = ["--workdir", str(workdir), "--split", "test_2016_flickr", "--no_progress", *FAST]
    assert evaluate.main([*arguments, "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["sentences"] == 3
    capsys.readouterr()
    (raw / "test_2016_flickr.de.gz").unlink()
    assert evaluate.main(arguments) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if " I " not in line]
    assert errors == [f"error: test_2016_flickr: {raw / 'test_2016_flickr.de.gz'} not found"]


def test_average_of_the_last_checkpoints(tmp_path):
    workdir, params, _ = make_workdir(tmp_path / "run", steps=(10, 20, 30, 40), scale=lambda step: step / 10)
    average_checkpoints.main(["--workdir", str(workdir), "--last", "3"])
    step, metadata, averaged = load_checkpoint(workdir, "averaged")
    assert step == 40 and metadata.step == 40 and metadata.averaged_steps == (20, 30, 40)
    expected = jax.tree.map(lambda leaf: np.asarray(leaf) * 3.0, params)  # mean of 2x, 3x, 4x
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), averaged, expected)
    Translator.from_workdir(workdir, "averaged", settings=translate_settings()).translate(["A cat."])
    with pytest.raises(CheckpointError) as refused:  # the run deleted some: keeping more would have kept them
        average_checkpoints.average_last(workdir, 5)
    assert str(refused.value) == (
        f"{workdir} has 4 checkpoints ([10, 20, 30, 40]); cannot average the last 5. "
        "Raise training.keep_checkpoints to keep more."
    )
    # An average of earlier checkpoints, then one of later ones: both stay, "averaged" is the newest.
    earlier = make_workdir(tmp_path / "earlier", steps=(10, 20, 30), scale=lambda step: step / 10)[0]
    assert average_checkpoints.average_last(earlier, 2) == (30, [20, 30])
    more = make_workdir(tmp_path / "more", steps=(40,), scale=lambda step: step / 10)[0]
    with pytest.raises(CheckpointError) as refused:  # fewer than the 3 it keeps: it saved no more
        average_checkpoints.average_last(more, 2)
    assert str(refused.value) == (
        f"{more} has 1 checkpoint ([40]); cannot average the last 2: the run saved no more (it keeps up to "
        "training.keep_checkpoints=3); use checkpoint 40 itself (an average of one is that checkpoint), or train on "
        "to save more"
    )
    shutil.copytree(more / "checkpoints" / "40", earlier / "checkpoints" / "40")
    assert average_checkpoints.average_last(earlier, 2) == (40, [30, 40])
    assert sorted(p.name for p in (earlier / "averaged").iterdir()) == ["30", "40"]
    assert load_checkpoint(earlier, "averaged")[1].averaged_steps == (30, 40)
