"""The keyword options `from_workdir` passes on to its class's constructor are checked by name
before the workdir is looked at: a search setting given there (`beam_size=8`) or a misspelled
option failed in the constructor, once the whole checkpoint had been read."""

import pytest

from jaxformer import LanguageModel, Translator


@pytest.mark.parametrize(
    "cls, options, message",
    [
        (
            Translator,
            {"beam_size": 8},
            "Translator.from_workdir got an unexpected keyword argument 'beam_size': it takes batch_size, "
            "length_bucket, max_buffer_growth, max_source_tokens, parallel_batches, seed; beam_size is a search "
            "setting: give the whole search, settings=DecodeSettings(method=..., beam_size=...)",
        ),
        (
            Translator,
            {"batch_size": 8, "batchsize": 8},
            "Translator.from_workdir got an unexpected keyword argument 'batchsize': it takes batch_size, "
            "length_bucket, max_buffer_growth, max_source_tokens, parallel_batches, seed; did you mean batch_size?",
        ),
        (  # the run's own target tokenizer is the one its model was trained with
            Translator,
            {"target_tokenizer": None},
            "Translator.from_workdir got an unexpected keyword argument 'target_tokenizer': it takes batch_size, "
            "length_bucket, max_buffer_growth, max_source_tokens, parallel_batches, seed",
        ),
        (  # jaxformer-generate's --max_new_tokens
            LanguageModel,
            {"max_new_tokens": 20},
            "LanguageModel.from_workdir got an unexpected keyword argument 'max_new_tokens': it takes batch_size, "
            "seed; max_extra_length is a search setting: give the whole search, "
            "settings=DecodeSettings(method=..., max_extra_length=...)",
        ),
        (  # a Translator's option
            LanguageModel,
            {"max_source_tokens": 64},
            "LanguageModel.from_workdir got an unexpected keyword argument 'max_source_tokens': it takes "
            "batch_size, seed",
        ),
    ],
)
def test_an_option_the_constructor_does_not_take_is_refused_before_the_workdir_is_read(tmp_path, cls, options, message):
    with pytest.raises(TypeError) as refused:
        cls.from_workdir(tmp_path / "no run", **options)
    assert str(refused.value) == message
