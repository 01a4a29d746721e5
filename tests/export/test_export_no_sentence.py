"""Sources that are no sentence (no ids, EOS alone), not one sentence (no EOS at the end, EOS before
it) or no sentence's ids (floats, another rank, ids outside the vocabulary) given to an export:
refused by its id-level entry points, as `Translator.translate_ids` refuses them, naming the
source, and no sentence given "" by its text-level ones, all without running its program, which
would invent a translation for them or translate input the model never saw."""

import io
import json
import shutil

import numpy as np
import pytest

from jaxformer.export import standalone
from tests.export.exports import record_in_program

pytestmark = pytest.mark.xdist_group("export")  # the export fixture of conftest.py, made once

EOS, PAD = 1, 0  # the export's special tokens (test_export.py checks its config.json)


@pytest.fixture
def unrun(exported):
    """The export, loaded with one sentence per batch and a program that must not run."""
    model = standalone.load(exported, batch_size=1)

    def run(params, source):
        raise AssertionError(f"the program ran on {source.tolist()}")

    model._run = run
    return model


def test_the_id_entry_points_refuse_no_sentence_before_any_batch(unrun):
    sentence = np.asarray([5, 6, 7, EOS], np.int32)  # longest, so the first batch were it decoded
    for bad, message in (
        (np.asarray([EOS], np.int32), rf"^source 1 is EOS \({EOS}\) alone: no sentence to translate "),
        (np.zeros(0, np.int32), rf"^source 1 is empty: a sentence's ids end with EOS \({EOS}\)$"),
        ([], r"^source 1 is empty: "),
        # the model was trained on one sentence per source, ending in EOS
        ([5, 6, 7], rf"^source 1 ends with id 7 at position 2, not EOS \({EOS}\): a sentence's ids end with EOS$"),
        (
            [5, EOS, 6, EOS],
            rf"^source 1 has EOS \({EOS}\) at position 1, before its end at position 3: one sentence per source$",
        ),
        ([EOS, EOS], rf"^source 1 has EOS \({EOS}\) at position 0, before its end at position 1: "),
        # the model's mask would drop a PAD inside a sentence without a word
        (
            [5, PAD, 7, EOS],
            rf"^source 1 has PAD \({PAD}\) at position 1, before its EOS at position 3: padding goes only after "
            "a sentence's EOS$",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            unrun.translate_sequences([sentence, bad])
    rows = np.full((2, 4), PAD, np.int32)
    rows[0] = sentence
    for second_row, message in (
        ([EOS, PAD, PAD, PAD], rf"^source row 1 is EOS \({EOS}\) alone: "),
        ([PAD] * 4, rf"^source row 1 is PAD \({PAD}\) alone: a sentence's ids end with EOS \({EOS}\)$"),
        ([5, 6, PAD, PAD], rf"^source row 1 ends with id 6 at position 1 \(before its padding\), not EOS \({EOS}\): "),
        ([5, EOS, 6, EOS], rf"^source row 1 has EOS \({EOS}\) at position 1, before its end at position 3: "),
        # only the padding after a row's EOS is dropped; a PAD before it is no sentence's id
        ([5, PAD, 7, EOS], rf"^source row 1 has PAD \({PAD}\) at position 1, before its EOS at position 3: "),
        ([PAD, 5, EOS, PAD], rf"^source row 1 has PAD \({PAD}\) at position 0, before its EOS at position 2: "),
        ([5, PAD, 6, PAD], rf"^source row 1 ends with id 6 at position 2 \(before its padding\), not EOS \({EOS}\)"),
        ([PAD, PAD, 5, PAD], rf"^source row 1 ends with id 5 at position 2 \(before its padding\), not EOS \({EOS}\)"),
    ):
        rows[1] = second_row
        with pytest.raises(ValueError, match=message):
            unrun.translate_ids(rows)


def test_translate_ids_names_an_empty_row_as_translate_sequences_names_an_empty_source(unrun):
    """[[]], which numpy makes float64 [1, 0], was refused as 'source must be a non-empty integer
    array [B, S]; got float64 (1, 0)': a dtype no one gave. Now its row is named, as
    translate_sequences (and Translator.translate_ids) name an empty source."""
    with pytest.raises(ValueError, match=rf"^source 0 is empty: a sentence's ids end with EOS \({EOS}\)$"):
        unrun.translate_sequences([[]])
    for source in ([[]], [[], []], np.zeros((2, 0), np.int32)):
        with pytest.raises(ValueError, match=rf"^source row 0 is empty: a sentence's ids end with EOS \({EOS}\)$"):
            unrun.translate_ids(source)
    for source, shape in (([], r"\(0,\)"), (np.zeros((0, 4), np.int32), r"\(0, 4\)"), ([5, EOS], r"\(2,\)")):
        refused = rf"^source must be padded rows of ids \[B, S\], at least one; got shape {shape}$"
        with pytest.raises(ValueError, match=refused):
            unrun.translate_ids(source)
    with pytest.raises(TypeError, match=r"^source row 0's ids must be integers, got dtype float64$"):
        unrun.translate_ids([[5.0, EOS]])


def test_translate_sequences_refuses_what_is_no_sentences_ids_naming_it_before_any_batch(unrun):
    sentence = np.asarray([5, 6, 7, EOS], np.int32)  # longest, so the first batch were it decoded
    vocabulary = unrun.vocab_size
    for bad, error, message in (
        (np.asarray([5.0, 6.0, EOS]), TypeError, r"^source 1's ids must be integers, got dtype float64$"),
        (np.asarray([3.7, EOS]), TypeError, r"^source 1's ids must be integers, got dtype float64$"),  # not 3
        (np.asarray([5, EOS]) > 0, TypeError, r"^source 1's ids must be integers, got dtype bool$"),
        (sentence[None], ValueError, r"^source 1 must be one sentence's ids \(1-D\), got shape \(1, 4\)$"),
        (
            [5, 6, vocabulary, EOS],
            ValueError,
            rf"^source 1: id {vocabulary} at position 2 is outside the model's source vocabulary \[0, {vocabulary}\)$",
        ),
        (np.asarray([5, -1, EOS], np.int64), ValueError, r"^source 1: id -1 at position 1 is outside "),
    ):
        with pytest.raises(error, match=message):
            unrun.translate_sequences([sentence, bad])
    with pytest.raises(TypeError, match=r"^sources must be a list of id sequences, not one of shape \(4,\): pass"):
        unrun.translate_sequences(sentence)


def test_the_text_entry_points_give_no_sentence_an_empty_output(unrun, monkeypatch):
    lines = ["", " ", "\u200b", "\ufeff"]  # each encodes to no piece, EOS alone
    assert [len(unrun.tokenizer.encode(line)) for line in lines] == [1] * len(lines)
    assert unrun.translate(lines) == [""] * len(lines)
    assert unrun.translate_nbest(lines) == [[("", 0.0)]] * len(lines)
    # serve.py's command line, which translates stdin's lines with `translate`
    monkeypatch.setattr(standalone, "load", lambda directory, batch_size, seed: unrun)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\n".join(lines).encode() + b"\n")))
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert standalone.main([]) == 0
    assert standalone.sys.stdout.getvalue() == "\n" * len(lines)


def test_the_id_entry_points_refuse_a_source_past_the_models_positions(exported, tmp_path):
    """An export of a model with max_positions P (an imported one's) ran a source of more ids on
    them, up to its bucket-rounded max_source_length, computing positions the model never had.
    Such a source is refused, naming it, its length and P; the padding after a row's EOS is no
    position, so a row padded past P runs."""
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    config = json.loads((copy / "config.json").read_text())
    positions = 6
    assert config["model"]["max_positions"] is None and config["serving"]["max_source_length"] > positions + 2
    config["model"]["max_positions"] = positions
    config["serving"]["max_source_tokens"] = positions  # more is refused as config.json is read
    (copy / "config.json").write_text(json.dumps(config))
    # as its program records them: an edit of config.json alone is refused (test_export_fixed_model.py)
    record_in_program(copy, lambda record: record | {"model": record["model"] | {"max_positions": positions}})
    model = standalone.load(copy, batch_size=1)
    ran = []

    def run(params, source):  # the program's output shapes, without its search
        ran.append(source.tolist())
        return np.zeros((len(source), 3, source.shape[1] + 8), np.int32), np.zeros((len(source), 3), np.float32)

    model._run = run
    fits, longer = [5] * (positions - 1) + [EOS], [5] * positions + [EOS]
    refused = rf"^source 1 has {positions + 1} ids \(EOS included\), more than the model's {positions} positions "
    with pytest.raises(ValueError, match=refused + r"\(model.max_positions\): "):
        model.translate_sequences([fits, longer])
    with pytest.raises(ValueError, match=refused.replace("source", "source row")):
        model.translate_ids(np.asarray([fits + [PAD], longer], np.int32))
    assert not ran
    model.translate_ids(np.asarray([fits + [PAD, PAD]], np.int32))
    model.translate_sequences([fits + [PAD, PAD]])
    bucket = config["serving"]["length_bucket"]  # the batch's width, past P: its padding is no position either
    assert ran == [[fits + [PAD, PAD]], [fits + [PAD] * (bucket - len(fits))]]


def test_translate_sequences_refuses_a_source_longer_than_the_program_takes_naming_it_before_any_batch(unrun):
    """A source of more ids than the program's bound on S (serving.max_source_length) failed as its
    batch was padded, naming neither the source nor its length ('source length 48 exceeds the 32
    tokens this export was made for': the padded length). Now it is named before any batch runs."""
    longest = unrun.max_source_length
    fits = np.asarray([5] * (longest - 1) + [EOS], np.int32)
    too_long = np.asarray([5] * longest + [EOS], np.int32)
    refused = (
        rf"^source 1 has {longest + 1} ids \(EOS included\), padded to {longest + 16} \(serving.length_bucket 16\): "
        rf"more than the {longest} this export's program takes \(serving.max_source_length, jaxformer-export "
        r"--max_source_tokens\); translate\(\) splits a longer sentence into pieces$"
    )
    for bad in (too_long, np.concatenate([too_long, [PAD, PAD]])):  # its padding not counted
        with pytest.raises(ValueError, match=refused):
            unrun.translate_sequences([fits, bad])
    with pytest.raises(AssertionError, match="the program ran"):  # the longest it takes passes the checks
        unrun.translate_sequences([fits, np.concatenate([fits, [PAD] * 5])])


def test_the_text_entry_points_name_a_sentence_that_is_no_unicode_text_before_any_batch(unrun):
    """A str holding a lone surrogate (json.loads('"\\ud800"') makes one) failed in sentencepiece
    with pybind11's 'Unable to cast Python instance of type <class 'str'> to C++ type', naming no
    sentence."""
    for entry in (unrun.translate, unrun.translate_nbest):
        with pytest.raises(ValueError, match=r"^sentence 1 is not valid Unicode text: '\\ud800' at character 2 is a"):
            entry(["A man.", "A \ud800 dog."])


def test_translate_ids_names_rows_of_several_lengths(unrun):
    """Rows of several lengths (a list of lists, which translate_sequences takes) failed in numpy
    with 'setting an array element with a sequence. The requested array has an inhomogeneous
    shape ...', naming no row."""
    refused = (
        r"^source must be padded rows of ids \[B, S\], all of one length: row 0 has 2 ids and row 2 3; pad each "
        rf"row after its EOS with PAD \({PAD}\), or pass the rows to translate_sequences$"
    )
    with pytest.raises(ValueError, match=refused):
        unrun.translate_ids([[5, EOS], [6, EOS], [5, 6, EOS]])
    with pytest.raises(ValueError, match="inhomogeneous"):  # rows of one length holding ragged items: numpy's
        unrun.translate_ids([[5, [6, 7]], [5, EOS]])
