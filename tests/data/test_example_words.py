"""The pipeline's messages about a split's examples, worded for what the run reads: a translator's
pairs (today's words, byte for byte) or a language model's texts, one side each
(text_sides.example_noun of the shipped configs, the sides their objectives read)."""

import logging

import pytest

from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import LengthFilter, TokenizePair, eval_batches, train_dataset
from jaxformer.training import objectives, text_sides
from jaxformer.training.config_file import load_config
from tests.data.test_pipeline import MAX_LENGTH, corpus, data_section  # noqa: F401 (corpus: the fixture)

HOLE = {"en": "\u200b".encode(), "de": b"\x07\x1b"}  # each side encodes to EOS alone: no piece
SIDES = {
    "encoder_decoder": objectives.Translation.features,
    "encoder_only": objectives.MaskedLanguageModel.features,
    "decoder_only": objectives.CausalLanguageModel.features,
}
SPACES = "(zero-width spaces, joiners or control characters alone)"
WORDS = {  # {noun: the messages' words, as a user reads them}
    "pairs": dict(
        skipped="skipped 2 pairs with an empty side in the {} split (first at pair 11; a side the tokenizer "
        "encodes to no piece or that shows nothing)",
        drawn="training: a pair with a side that encodes to no piece or shows nothing (a zero-width space, joiner or "
        "control characters alone) was drawn and is left out, as every such pair is; the validation lines count them",
        left_out="; the length filter dropped {} and left out {} with a side of no piece or nothing visible of the {} "
        "training pairs read since the run started",
        every="{}: every pair has a side the tokenizer encodes to no piece or that shows nothing "
        f"{SPACES}: nothing to read in its 6 pairs",
        stream="no training pair fits data.max_length=40 tokens a side: the last 19 drawn were all longer (0 so far: "
        "raise data.max_length) or had a side of no piece or nothing visible (19: mend the data)",
        none_fits="{}: none of the 301 examples fits data.max_length=1 tokens a side",
    ),
    "texts": dict(
        skipped="skipped 2 lines without text in the {} split (first at text 11; the tokenizer encodes it to no "
        "piece or it shows nothing)",
        drawn="training: a text that encodes to no piece or shows nothing (a zero-width space, joiner or control "
        "characters alone) was drawn and is left out, as every such text is; the validation lines count them",
        left_out="; the length filter dropped {} and left out {} that encode to no piece or show nothing of the {} "
        "training texts read since the run started",
        every=f"{{}}: every text encodes to no piece or shows nothing {SPACES}: nothing to read in its 6 texts",
        stream="no training text fits data.max_length=40 tokens: the last 19 drawn were all longer (0 so far: "
        "raise data.max_length) or encoded to no piece or showed nothing (19: mend the data)",
        none_fits="{}: none of the 301 texts fits data.max_length=1 tokens",
    ),
}


@pytest.fixture(params=["multi30k", "multi30k_lm", "multi30k_mlm"])
def run(request, corpus):  # noqa: F811 (the fixture imported above)
    """(its example noun, a training split reader, an evaluation one) as a run of the config reads them."""
    config = load_config(request.param)
    noun, features = text_sides.example_noun(config), SIDES[text_sides.architecture(config)]
    records, tokenizer = corpus

    def train(split, length_filter=None, **overrides):
        data = data_section(**overrides)
        length_filter = length_filter or LengthFilter(data.max_length, noun)  # as run_batches makes it
        tokenize = TokenizePair.for_data(data, tokenizer, features=features)
        return train_dataset(split, tokenize, data, length_filter=length_filter)

    def evaluate(split, **overrides):
        data = data_section(**overrides)
        return eval_batches(split, TokenizePair.for_data(data, tokenizer, features=features), data, noun)

    return noun, records, train, evaluate


def said(caplog):
    return [message for message in caplog.messages if "no piece" in message]


@pytest.mark.parametrize("encode_once", [True, False])
def test_examples_of_no_piece_are_said_in_the_runs_words(run, encode_once, caplog):
    noun, records, train, evaluate = run
    words = WORDS[noun]
    with_holes = [*records[:10], HOLE, *records[10:20], HOLE, *records[20:]]
    length_filter = LengthFilter(MAX_LENGTH, noun)
    with caplog.at_level(logging.WARNING):
        batches = iter(train(with_holes, length_filter, encode_once_max_examples=10**6 if encode_once else 0))
        while length_filter.seen < 2 * len(with_holes):
            next(batches)
    assert said(caplog) == [words["skipped"].format("training") if encode_once else words["drawn"]]
    counts = length_filter.dropped, length_filter.no_piece, length_filter.seen
    assert length_filter.no_piece >= 2 and length_filter.dropped_since(0) == words["left_out"].format(*counts)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        evaluate(with_holes)
    assert said(caplog) == [words["skipped"].format("validation")]


@pytest.mark.parametrize("encode_once", [True, False])
def test_a_split_of_no_piece_or_too_long_is_refused_in_the_runs_words(run, encode_once):
    noun, records, train, evaluate = run
    words = WORDS[noun]
    overrides = dict(encode_once_max_examples=10**6 if encode_once else 0)
    holes = [HOLE] * 6
    with pytest.raises(DataError) as raised:
        next(iter(train(holes, **overrides)))
    assert str(raised.value) == (words["every"].format("training") if encode_once else words["stream"])
    with pytest.raises(DataError) as raised:
        evaluate(holes)
    assert str(raised.value) == words["every"].format("validation")
    if encode_once:  # streamed, the split of no piece above says the same for longer ones
        with pytest.raises(DataError) as raised:
            train(records, max_length=1, **overrides)
        assert str(raised.value).startswith(words["none_fits"].format("training") + "; the shortest needs ")
    with pytest.raises(DataError) as raised:
        evaluate(records, max_length=1)
    assert str(raised.value) == words["none_fits"].format("validation") + "; raise data.max_length"
