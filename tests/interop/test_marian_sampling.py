"""generate()'s sampling settings (do_sample) in a MarianMT generation config, as jaxformer-convert
reads them (jaxformer/interop/marian_generation.py): jaxformer-translate's sampling flags for
temperature and top_k, one line for each setting jaxformer's sampling cannot reproduce, and the
values generate cannot sample with refused in one line. test_marian.py checks the flags against
transformers' own sampling."""

import pytest

from jaxformer.interop.marian_generation import search_flags, unreproduced_sampling
from jaxformer.interop.marian_layout import ConversionError


def test_sampling_gives_jaxformers_sampling_flags_whatever_the_beam_settings():
    settings = {"do_sample": True, "temperature": 0.35, "top_k": 7, "num_beams": 4, "length_penalty": 2.0}
    assert search_flags(settings, "g.json", 300) == ("--method", "sample", "--temperature", "0.35", "--top_k", "7")
    renormalized = {"do_sample": True, "renormalize_logits": True}
    assert search_flags(renormalized, "g.json", 300)[-2:] == ("--renormalize_after_bans", "true")
    assert search_flags({"do_sample": False, "temperature": 0.35}, "g.json", 300) == ("--method", "greedy")


def test_each_sampling_setting_jaxformer_lacks_is_named_with_its_value():
    settings = {"do_sample": True, "num_beams": 4, "top_p": 0.9, "min_p": 0.05, "eta_cutoff": "x", "top_k": 5}
    lines = unreproduced_sampling(settings, "g.json")
    assert [line.split(" ")[1] for line in lines] == ["num_beams=4", "top_p=0.9", "min_p=0.05", 'eta_cutoff="x"']
    assert all(line.startswith("g.json: ") and "\n" not in line for line in lines)
    assert "samples within a beam search" in lines[0] and "no such setting" in lines[1]


def test_settings_that_leave_sampling_unchanged_or_act_only_when_sampling_are_not_named():
    neutral = {"top_p": 1.0, "typical_p": 1.0, "min_p": None, "top_h": None, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
    assert unreproduced_sampling({"do_sample": True, "num_beams": 1, **neutral}, "g.json") == ()
    assert unreproduced_sampling({"do_sample": False, "top_p": 0.9, "num_beams": 4}, "g.json") == ()
    assert unreproduced_sampling({"top_p": 0.9}, "g.json") == ()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"do_sample": "true"}, 'g.json: do_sample="true" is not a JSON boolean (true or false)'),
        ({"do_sample": True, "temperature": 0}, "g.json: temperature=0 is not a number > 0"),
        ({"do_sample": True, "temperature": "hot"}, 'g.json: temperature="hot" is not a number > 0'),
        ({"do_sample": True, "top_k": -1}, "g.json: top_k=-1 is not an integer >= 0"),
        ({"do_sample": True, "top_k": 2.5}, "g.json: top_k=2.5 is not an integer >= 0"),
    ],
)
def test_values_generate_cannot_sample_with_are_refused_in_one_line(settings, message):
    with pytest.raises(ConversionError) as raised:
        search_flags(settings, "g.json", 300)
    assert str(raised.value) == message
