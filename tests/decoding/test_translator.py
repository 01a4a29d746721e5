"""Translator: loading from a workdir, batching by length with input order restored, edge cases."""

import logging
import re

import jaxtyping
import numpy as np
import pytest

from jaxformer.decoding import sentence_batches
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.errors import CheckpointError
from jaxformer.run.loading import load_checkpoint
from jaxformer.tokens import EOS_ID, PAD_ID, UNK_ID
from tests.conftest import assert_option_refused, assert_seed_refused, make_workdir, read_raw

pytestmark = pytest.mark.xdist_group("decoding-workdir")
GREEDY = DecodeSettings(method="greedy", max_extra_length=8)


@pytest.fixture(scope="module")
def translator(decoding_workdir):
    return Translator.from_workdir(decoding_workdir, settings=GREEDY, batch_size=8)


def test_batch_translation_keeps_input_order(translator):
    sentences = read_raw("val.en.gz", 20)
    together = translator.translate(sentences)  # sorted by length into 3 batches, then put back
    one_by_one = [translator.translate([sentence])[0] for sentence in sentences[:6]]
    assert len(together) == len(sentences)
    assert together[:6] == one_by_one
    assert len(set(together)) > 1  # distinct inputs give distinct outputs, so order is observable


def test_empty_and_overlong_sentences(translator, caplog):
    long_sentence = " ".join(read_raw("val.en.gz", 40))  # about 500 tokens: translated in pieces
    translator_small = Translator(
        translator.config, translator.params, translator.tokenizer, GREEDY, max_source_tokens=64
    )
    with caplog.at_level(logging.WARNING):
        outputs = translator_small.translate(["", "A dog runs.", "   ", long_sentence])
    assert re.fullmatch(
        r"sentence 4 \(line 4\) has \d+ tokens, more than max_source_tokens=64: .*", caplog.messages[-1]
    )
    assert outputs[0] == "" and outputs[2] == ""
    assert outputs[1] == translator.translate(["A dog runs."])[0]
    # Lines that are empty to the tokenizer were decoded from EOS alone, an invented translation.
    nothing = ["\u200b", "\x01\x02", "\ufeff", " \u200b\t", "\x7f", "\u200c\u200e\u200f\u061c"]  # ..., direction marks
    assert [len(translator.tokenizer.encode(text, add_eos=False)) for text in nothing] == [0] * len(nothing)
    assert translator.translate_nbest(nothing) == [[("", 0.0)]] * len(nothing)
    # What the normaliser (nmt_nfkc) keeps is an unknown piece, which was given an invented translation:
    # NUL, a C1 control, a zero-width joiner, a soft hyphen, a bidi isolate. They show nothing: empty lines.
    unknown = ["\x00", "\x85", "\u200d", "\xad", "\u2066\u2069"]
    assert [translator.tokenizer.encode(text, add_eos=False)[-1] for text in unknown] == [UNK_ID] * len(unknown)
    assert translator.translate_nbest(unknown) == [[("", 0.0)]] * len(unknown)
    pieces = sentence_batches.split_sentence(long_sentence, translator.tokenizer, 64, EOS_ID)
    assert len(pieces) > 1 and all(len(piece) <= 64 and piece[-1] == EOS_ID for piece in pieces)
    # Nothing dropped: the pieces hold every token of the sentence.
    tokenizer = translator.tokenizer
    content = np.concatenate([piece[:-1] for piece in pieces])
    assert tokenizer.decode(content) == tokenizer.decode(tokenizer.encode(long_sentence))
    piece_translations = [translator.tokenizer.decode(nbest[0][0]) for nbest in translator_small.translate_ids(pieces)]
    joined = piece_translations[0]
    for text in piece_translations[1:]:
        joined = f"{joined} {text}".strip()
    assert outputs[3] == joined  # every piece translated, in order


def test_any_iterable_of_sentences_is_read_once_before_the_search(translator, tmp_path, monkeypatch):
    """A generator or a file's lines failed with "object of type 'generator' has no len()" once
    every sentence was decoded."""
    sentences = read_raw("val.en.gz", 3)
    expected = translator.translate(sentences)
    assert translator.translate(sentence for sentence in sentences) == expected
    (tmp_path / "in.en").write_text("".join(f"{sentence}\n" for sentence in sentences))
    with open(tmp_path / "in.en") as lines:  # each with its line break, which the tokenizer ignores
        assert translator.translate(lines) == expected
    nbest = translator.translate_nbest(iter(sentences))
    assert [hypotheses[0][0] for hypotheses in nbest] == expected

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran")

    monkeypatch.setattr(translator, "translate_ids", no_search)
    with pytest.raises(TypeError, match="^sentence 2 is bytes, not str$"):  # found before any decoding
        translator.translate(sentence for sentence in ["A man.", "A dog.", b"A cat."])


def test_sentences_that_are_not_an_iterable_of_text_are_named_before_any_search(translator, monkeypatch):
    """None or an int failed as "'NoneType' object is not iterable", naming no argument; a str
    holding a lone surrogate (json.loads('"\\ud800"') makes one) failed in sentencepiece as "List
    elements must be str or bytes", naming no sentence."""

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran")

    monkeypatch.setattr(translator, "translate_ids", no_search)
    previous = jaxtyping.config.jaxtyping_disable  # the test session's beartype checks, which a user has not
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        for value, name in ((None, "NoneType"), (5, "int")):
            with pytest.raises(TypeError, match=rf"^sentences must be an iterable of str \(a list, .*\), not {name}$"):
                translator.translate(value)
    finally:
        jaxtyping.config.update("jaxtyping_disable", previous)
    unencodable = (
        r"^sentence 1 is not valid Unicode text: '\\udc80' at character 1 is a lone surrogate, which has no UTF-8$"
    )
    for entry in (translator.translate, translator.translate_nbest):
        with pytest.raises(ValueError, match=unencodable):
            entry(["A man.", b"A\x80".decode("utf-8", "surrogateescape")])


def test_bad_arguments_are_refused_before_any_search(translator):
    with pytest.raises(TypeError, match=r"sentences must be a list of str, not one str: pass \[sentence\]"):
        translator.translate("A man.")  # not six one-letter sentences
    with pytest.raises(TypeError, match="not one str"):
        translator.translate_nbest("A man.")
    parts = (translator.config, translator.params, translator.tokenizer, GREEDY)
    for name, value, minimum in (
        ("max_source_tokens", 0, 2),  # a piece of at most one token holds only its EOS: the sentence would vanish
        ("max_source_tokens", 1, 2),
        ("batch_size", 0, 1),
        ("batch_size", -1, 1),
        ("length_bucket", 0, 1),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer >= {minimum}, got {value}$"):
            Translator(*parts[:3], GREEDY, **{name: value})
    vocabulary = translator.config.vocab_size
    sample = DecodeSettings(method="sample", top_k=vocabulary + 1)
    with pytest.raises(ValueError, match=rf"top_k={vocabulary + 1} is more than the model's {vocabulary} tokens"):
        Translator(*parts[:3], sample)
    Translator(*parts[:3], DecodeSettings(method="sample", top_k=vocabulary))  # all of them: allowed
    with pytest.raises(ValueError, match=rf"^beam_size={vocabulary + 1} is more than the model's {vocabulary} tokens"):
        Translator(*parts[:3], DecodeSettings(beam_size=vocabulary + 1))
    Translator(*parts[:3], DecodeSettings(method="greedy", beam_size=vocabulary + 1))  # not a beam: unused


def test_seeds_that_jax_would_take_for_others_are_refused_before_anything_is_read(translator, tmp_path):
    import jax

    # Why: jax.random.key keeps a seed's low 32 bits, so 2**32 samples as 0 does and -1 as 2**32 - 1.
    for seed, alias in ((2**32, 0), (-1, 2**32 - 1)):
        assert (jax.random.key_data(jax.random.key(seed)) == jax.random.key_data(jax.random.key(alias))).all()
    parts = (translator.config, translator.params, translator.tokenizer, GREEDY)
    assert Translator(*parts, seed=2**32 - 1).settings == GREEDY
    for seed in (2**32, -1, 2**64, True):
        assert_seed_refused(Translator, parts, seed, tmp_path / "no run")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"length_bucket": 0}, "length_bucket must be an integer >= 1, got 0"),
        ({"max_source_tokens": 1}, "max_source_tokens must be an integer >= 2, got 1"),
        (  # a longer line would be searched over its whole length (memory), not in pieces
            {"max_source_tokens": 10**20},
            "max_source_tokens must be at most 4096 (longer lines are translated in pieces), got 100000000000000000000",
        ),
        ({"parallel_batches": 0}, "parallel_batches must be an integer >= 1, got 0"),
        ({"max_buffer_growth": 0.5}, "max_buffer_growth must be >= 1, got 0.5"),
    ],
)
def test_options_it_cannot_run_with_are_refused_before_anything_is_read(translator, tmp_path, options, message):
    """from_workdir read the whole checkpoint before the constructor refused them."""
    parts = (translator.config, translator.params, translator.tokenizer, GREEDY)
    assert_option_refused(Translator, parts, options, message, tmp_path / "no run")


def test_translate_ids_names_the_callers_source(translator):
    vocabulary = translator.config.encoder_vocab_size
    sources = [np.array([5, 6, EOS_ID]), np.array([5, 6, 7, 8, 9, vocabulary, EOS_ID]), np.array([5, EOS_ID])]
    # The longest source is row 0 of the length-sorted batch: the message names the caller's index.
    outside = rf"^source 1: id {vocabulary} at position 5 is outside the model's source vocabulary \[0, {vocabulary}\)$"
    with pytest.raises(ValueError, match=outside):
        translator.translate_ids(sources)
    sources[1][5] = -1
    with pytest.raises(ValueError, match=r"^source 1: id -1 at position 5 "):
        translator.translate_ids(sources)
    # Why: the ids were cast to int64 for the check, so uint64's 2**63 was named as -2**63 (an export names it right).
    for huge in (2**63, 2**64 - 1):
        unsigned = [source.astype(np.uint64) for source in sources]
        unsigned[1][5] = huge
        with pytest.raises(ValueError, match=rf"^source 1: id {huge} at position 5 is outside "):
            translator.translate_ids(unsigned)
    with pytest.raises(
        TypeError, match=r"^sources must be a list of id sequences, not one of shape \(3,\): pass \[ids\]$"
    ):
        translator.translate_ids(sources[0])
    for bad, error, message in (
        (sources[0][None], ValueError, r"^source 1 must be one sentence's ids \(1-D\), got shape \(1, 3\)$"),
        (sources[0].astype(np.float32), TypeError, r"^source 1's ids must be integers, got dtype float32$"),
        (sources[0] > 0, TypeError, r"^source 1's ids must be integers, got dtype bool$"),
        ([], ValueError, rf"^source 1 is empty: a sentence's ids end with EOS \({EOS_ID}\)$"),
        (np.zeros(0, np.int32), ValueError, r"^source 1 is empty: "),
        # what translate() makes of a line that encodes to no piece, given empty output there
        ([EOS_ID], ValueError, rf"^source 1 is EOS \({EOS_ID}\) alone: no sentence to translate "),
        # the model was trained on one sentence per source, ending in EOS
        (
            [5, 6, 7],
            ValueError,
            rf"^source 1 ends with id 7 at position 2, not EOS \({EOS_ID}\): a sentence's ids end with EOS$",
        ),
        (
            [5, EOS_ID, 6, EOS_ID],
            ValueError,
            rf"^source 1 has EOS \({EOS_ID}\) at position 1, before its end at position 3: one sentence per source$",
        ),
        ([EOS_ID, EOS_ID], ValueError, r"^source 1 has EOS \(1\) at position 0, before its end at position 1: "),
        # the encoder's mask would drop a PAD inside a sentence without a word
        (
            [5, PAD_ID, 7, EOS_ID],
            ValueError,
            rf"^source 1 has PAD \({PAD_ID}\) at position 1, before its EOS at position 3: padding goes only after "
            "a sentence's EOS$",
        ),
        ([PAD_ID, 5, EOS_ID], ValueError, rf"^source 1 has PAD \({PAD_ID}\) at position 0, before its EOS "),
    ):
        with pytest.raises(error, match=message):
            translator.translate_ids([sources[0], bad])
    with pytest.raises(ValueError, match=r"^source 0 is empty: "):  # alone: an IndexError from the batching
        translator.translate_ids([[]])
    expected = translator.translate_ids([sources[0], sources[2]])
    for given in ([sources[0].astype(np.int64), sources[2].astype(np.uint16)], [sources[0].tolist(), [5, EOS_ID]]):
        assert [[ids.tolist() for ids, _ in nbest] for nbest in translator.translate_ids(given)] == [
            [ids.tolist() for ids, _ in nbest] for nbest in expected
        ]


def test_translate_ids_drops_the_padding_after_each_sources_eos(translator):
    sentences = read_raw("val.en.gz", 5)
    unpadded = [translator.tokenizer.encode(sentence) for sentence in sentences]
    rows = np.full((len(unpadded), max(map(len, unpadded)) + 3), PAD_ID)  # make_generate_fn's layout, [B, S]
    for row, ids in enumerate(unpadded):
        rows[row, : len(ids)] = ids
    expected = [[(ids.tolist(), score) for ids, score in nbest] for nbest in translator.translate_ids(unpadded)]
    for padded in (
        rows,
        list(rows),
        [np.pad(ids, (0, row), constant_values=PAD_ID) for row, ids in enumerate(unpadded)],
    ):
        translated = translator.translate_ids(padded)
        assert [[(ids.tolist(), score) for ids, score in nbest] for nbest in translated] == expected
    # Padding before EOS, or with no EOS before it, is refused, in words that say where padding goes.
    for bad, message in (
        (
            [5, PAD_ID, 6, EOS_ID, PAD_ID],
            rf"has PAD \({PAD_ID}\) at position 1, before its EOS at position 3: padding ",
        ),
        ([5, 6, PAD_ID, PAD_ID], r"ends with id 6 at position 1 \(before its padding\), not EOS "),
        ([PAD_ID, PAD_ID], rf"is PAD \({PAD_ID}\) alone: a sentence's ids end with EOS \({EOS_ID}\)$"),
        ([EOS_ID, PAD_ID], rf"is EOS \({EOS_ID}\) alone: "),
    ):
        with pytest.raises(ValueError, match="^source 1 " + message):
            translator.translate_ids([unpadded[0], bad])


def test_from_workdir_checks_the_settings_before_reading_parameters(decoding_workdir, monkeypatch):
    from jaxformer.run.checkpoint import Checkpointer

    def parameters_read(*args):
        pytest.fail("the parameters were read")

    monkeypatch.setattr(Checkpointer, "_restore_params", parameters_read)
    vocabulary = Translator.check_workdir(decoding_workdir).vocab_size
    with pytest.raises(ValueError, match=rf"^top_k={vocabulary + 1} is more than the model's {vocabulary} tokens"):
        Translator.from_workdir(decoding_workdir, settings=DecodeSettings(method="sample", top_k=vocabulary + 1))


def test_from_workdir_reads_a_checkpoint_choice_as_the_command_line_does(decoding_workdir, monkeypatch):
    assert Translator.from_workdir(decoding_workdir, "1", settings=GREEDY).step == 1  # as --checkpoint 1
    from jaxformer.decoding import translator as translator_module

    monkeypatch.setattr(translator_module, "require_architecture", None)  # refused before anything is read
    with pytest.raises(TypeError) as raised:
        Translator.from_workdir(decoding_workdir, True)  # was "no checkpoint for step True"
    assert str(raised.value) == (
        "checkpoint=True: give latest, best, averaged, final or a step number (an int, or its digits as a str)"
    )


def test_nbest_is_sorted_and_beam_4_by_default(decoding_workdir):
    translator = Translator.from_workdir(decoding_workdir)
    assert translator.settings.beam_size == 4 and translator.settings.alpha == 0.6
    nbest = translator.translate_nbest(["A man rides a horse.", "Two children play."])
    for hypotheses in nbest:
        scores = [score for _, score in hypotheses]
        assert len(hypotheses) == 4 and scores == sorted(scores, reverse=True)


def test_missing_checkpoints_are_named(tmp_path, decoding_workdir):
    with pytest.raises(CheckpointError) as missing:  # with what keeps one, as "averaged" and "final" say theirs
        load_checkpoint(decoding_workdir, "best")
    assert str(missing.value) == (
        f"{decoding_workdir / 'best'} does not exist: no 'best' checkpoint in {decoding_workdir}: best/ keeps the "
        "parameters with the best validation BLEU, which training scores with training.bleu_every_steps > 0 (as "
        "multi30k sets it), from its first score on"
    )
    with pytest.raises(CheckpointError, match="no checkpoint for step 7"):
        load_checkpoint(decoding_workdir, 7)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing-here")


def test_corrupt_checkpoint_is_an_error_not_garbage(tmp_path):
    workdir, params, _ = make_workdir(tmp_path / "run")
    step, _, restored = load_checkpoint(workdir)
    assert step == 1
    np.testing.assert_array_equal(
        restored["decoder"]["layer_0"]["feed_forward"]["wi_kernel"],
        params["decoder"]["layer_0"]["feed_forward"]["wi_kernel"],
    )
    for path in (workdir / "checkpoints" / "1" / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 1000:
            path.write_bytes(b"\0" * 16)  # truncate the array data
    with pytest.raises(CheckpointError, match="cannot"):
        load_checkpoint(workdir)


def test_parameters_from_a_one_device_mesh_get_the_program_loaded_ones_get(translator):
    """The run's final choice translates the training loop's parameters (sharded over its mesh,
    here of one device, inside that mesh); translate.py loads them from a checkpoint. The
    search must be one program for both, so the persistent compilation cache serves the second."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    source, rng = np.full((8, 16), EOS_ID, np.int32), translator._rng
    loaded = translator._generate.lower(translator.params, source, rng).as_text()
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    with jax.set_mesh(mesh):
        sharded = jax.device_put(translator.params, NamedSharding(mesh, PartitionSpec()))
        assert translator._generate.lower(sharded, source, rng).as_text() != loaded  # what the fix is for
        trained = translator.with_params(sharded)
        assert trained._generate.lower(trained.params, source, rng).as_text() == loaded
        assert trained.translate(read_raw("val.en.gz", 4)) == translator.translate(read_raw("val.en.gz", 4))


def test_evaluate_refuses_a_search_the_model_cannot_run_before_reading_the_split(decoding_workdir, capsys):
    from jaxformer.commands import evaluate

    vocabulary = Translator.check_workdir(decoding_workdir).vocab_size
    flags = ["--workdir", str(decoding_workdir), "--split", "validation", "--method", "sample"]
    assert evaluate.main([*flags, "--top_k", str(vocabulary + 1)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: top_k={vocabulary + 1} is more than the model's ")
    assert "pairs" not in err and "loaded step" not in err  # neither the split nor the parameters read
