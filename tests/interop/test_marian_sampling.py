"""generate()'s sampling settings (do_sample) in a MarianMT generation config, as jaxformer-convert
reads them (jaxformer/interop/marian_generation.py): jaxformer-translate's sampling flags for
temperature and top_k, drawing as transformers' generate draws; one line for each setting
jaxformer's sampling cannot reproduce; the values generate cannot sample with refused in one line.
test_marian.py's test_convert_names_the_flags_that_search_as_the_models_generate_does reads the
flags back through jaxformer-translate's parser."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import GenerationConfig, MarianTokenizer  # noqa: E402

from jaxformer.decoding.translator import Translator  # noqa: E402
from jaxformer.interop.marian import import_marian  # noqa: E402
from jaxformer.interop.marian_generation import search_flags, unreproduced_sampling  # noqa: E402
from jaxformer.interop.marian_layout import ConversionError, marian_to_jaxformer_ids  # noqa: E402
from tests.interop.marian_models import MAX_EXTRA, sentences, write_marian  # noqa: E402

pytestmark = pytest.mark.xdist_group("interop-sampling")  # the module's model is built once
# jaxformer's rule for a temperature (generate.TEMPERATURE_RULE), the sampling's and its flags'.
FLOAT32_TEMPERATURE = "a finite number > 0 that float32 holds (at most 3.4028235e+38)"


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A saved tiny MarianMT directory and its model (marian_models.write_marian)."""
    directory = tmp_path_factory.mktemp("marian")
    return directory, write_marian(directory)


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
        ({"do_sample": True, "temperature": 0}, f"g.json: temperature=0 is not {FLOAT32_TEMPERATURE}"),
        ({"do_sample": True, "temperature": "hot"}, f'g.json: temperature="hot" is not {FLOAT32_TEMPERATURE}'),
        # float32 cannot hold it: the sampling's logits divided by inf draw every token alike.
        ({"do_sample": True, "temperature": 1e39}, f"g.json: temperature=1e+39 is not {FLOAT32_TEMPERATURE}"),
        ({"do_sample": True, "top_k": -1}, "g.json: top_k=-1 is not an integer >= 0"),
        ({"do_sample": True, "top_k": 2.5}, "g.json: top_k=2.5 is not an integer >= 0"),
    ],
)
def test_values_generate_cannot_sample_with_are_refused_in_one_line(settings, message):
    with pytest.raises(ConversionError) as raised:
        search_flags(settings, "g.json", 300)
    assert str(raised.value) == message


def test_convert_names_each_sampling_setting_the_flags_cannot_reproduce(marian, tmp_path, capsys):
    """top_p was dropped without a word: convert's message now says it on a line of its own."""
    from jaxformer.commands import convert

    directory = shutil.copytree(marian[0], tmp_path / "marian")
    settings = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**settings, "do_sample": True, "top_p": 0.9}))
    assert convert.main(["--from_hf", str(directory), "--output", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("by default with --method sample --temperature 1.0 --top_k 50")
    assert lines[1:] == [
        f"{directory / 'generation_config.json'}: top_p=0.9 restricts transformers' sampling, and jaxformer's "
        "sampling has no such setting (only --temperature and --top_k): its samples follow another distribution"
    ]


def first_step_distribution(model, source, generation):
    """The distribution transformers' generate samples the first target token of `source` from
    under the generation settings `generation` (its processed scores: bans, temperature, top-k)."""
    settings = GenerationConfig(
        **generation,
        max_new_tokens=2,  # the model forces EOS at the last step: the first is free
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        scores = model.generate(input_ids=torch.tensor([source]), generation_config=settings).scores[0]
    return torch.softmax(scores[0], dim=-1).numpy()


@pytest.mark.slow  # 2,000 samples: about 8 s
def test_sampling_with_convert_flags_draws_from_the_distribution_of_transformers_generate(marian, tmp_path):
    """Under do_sample=true (with OPUS-MT's pad ban) jaxformer-translate with the flags convert
    names samples from the distribution transformers' generate samples from: the first tokens of
    2,000 samples of one sentence against generate's first-step distribution, in total variation
    (about 0.02 expected from 2,000 draws among 5 tokens; generate's distribution at jaxformer's
    default sampling flags, temperature 1 over all tokens, is further than 0.1 from it)."""
    from jaxformer.commands import decoding_flags, translate

    directory, model = marian
    directory = shutil.copytree(directory, tmp_path / "marian")
    pad = model.config.pad_token_id
    generation = {
        **json.loads((directory / "generation_config.json").read_text()),
        **{"do_sample": True, "temperature": 0.7, "top_k": 5, "bad_words_ids": [[pad]]},
    }
    (directory / "generation_config.json").write_text(json.dumps(generation))
    converted = import_marian(directory, tmp_path / "run")
    args = translate.build_parser().parse_args(["--workdir", str(tmp_path / "run"), *converted.search_flags])
    settings = decoding_flags.decode_settings_from_flags(args, MAX_EXTRA)
    translator = Translator.from_workdir(tmp_path / "run", settings=settings, batch_size=500)
    source = MarianTokenizer.from_pretrained(directory)(min(sentences(40), key=len))["input_ids"]
    ids = marian_to_jaxformer_ids(converted.order)[source].astype(np.int32)
    draws = 2000
    first = [int(converted.order[hypotheses[0][0][0]]) for hypotheses in translator.translate_ids([ids] * draws)]
    sampled = np.bincount(first, minlength=model.config.vocab_size) / draws
    expected = first_step_distribution(model, source, generation)
    distance = 0.5 * np.abs(sampled - expected).sum()
    plain = first_step_distribution(model, source, {**generation, "temperature": 1.0, "top_k": 0})
    assert distance < 0.05 < 0.1 < 0.5 * np.abs(plain - expected).sum(), distance  # the test can fail
