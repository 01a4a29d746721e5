"""generate()'s search in a MarianMT directory and in a jaxformer run's `decoding` section, both
ways (jaxformer/interop/marian_generation.py): an import records the model's num_beams,
length_penalty and early_stopping, and --to_hf writes a run's search into generation_config.json,
so that transformers' generate on the export searches as the run does. --to_hf wrote none of them,
and generate on an exported beam-search run (an OPUS-MT model imported and exported included)
searched greedily."""

import json
import logging
import shutil

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import GenerationConfig, MarianMTModel  # noqa: E402

from jaxformer.commands import convert  # noqa: E402
from jaxformer.decoding.generate import DecodeSettings  # noqa: E402
from jaxformer.decoding.translator import Translator  # noqa: E402
from jaxformer.interop.marian import import_marian  # noqa: E402
from jaxformer.interop.marian_export import export_marian  # noqa: E402
from jaxformer.interop.marian_files import read_marian_directory  # noqa: E402
from jaxformer.interop.marian_generation import exported_search, unbanned_tokens  # noqa: E402
from jaxformer.run.checkpoint import Checkpointer  # noqa: E402
from jaxformer.run.directory import RunDirectory  # noqa: E402
from jaxformer.run.loading import load_checkpoint  # noqa: E402
from tests.interop.marian_models import MAX_EXTRA, sentences, until_eos, write_marian  # noqa: E402

pytestmark = pytest.mark.xdist_group("interop-generate-settings")  # the module's models are built once

# transformers' early_stopping for each of jaxformer's beam stop rules (generate.py's docstring of --stop).
EARLY_STOPPING = {"exact": "never", "current_length": False, "beam_full": True}
# The search's settings of generate, with the values it takes where a generation config sets none.
GENERATE_DEFAULTS = {"num_beams": 1, "length_penalty": 1.0, "early_stopping": False, "do_sample": False}


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    directory = tmp_path_factory.mktemp("marian") / "opus"
    write_marian(directory)
    return directory


def _round_trip(marian, tmp_path, generation):
    """The `marian` model with `generation` in its generation_config.json, imported as a run and
    exported again: (the model's directory, the run, the export)."""
    directory = shutil.copytree(marian, tmp_path / "opus")
    settings = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**settings, **generation}))
    import_marian(directory, tmp_path / "run")
    return directory, tmp_path / "run", export_marian(tmp_path / "run", tmp_path / "exported")


@pytest.fixture(scope="module")
def opus_beam(marian, tmp_path_factory):
    """OPUS-MT's search (num_beams 4, generate's length_penalty 1.0) through from_hf and to_hf."""
    return _round_trip(marian, tmp_path_factory.mktemp("beam"), {"num_beams": 4, "length_penalty": 1.0})


def _search(directory):
    settings = GenerationConfig.from_pretrained(directory)
    values = {key: getattr(settings, key) for key in GENERATE_DEFAULTS}
    return {key: default if values[key] is None else values[key] for key, default in GENERATE_DEFAULTS.items()}


@pytest.mark.parametrize(
    "generation",
    [
        None,  # opus_beam's
        {"num_beams": 5, "length_penalty": 0.8, "early_stopping": "never"},
        {"num_beams": 3, "length_penalty": 1.2, "early_stopping": True},
        {},  # generate's default: greedy
    ],
)
def test_the_models_search_survives_from_hf_then_to_hf(marian, opus_beam, tmp_path, generation):
    directory, _, exported = opus_beam if generation is None else _round_trip(marian, tmp_path, generation)
    assert _search(exported) == _search(directory)
    if generation is None:
        assert _search(exported)["num_beams"] == 4 and _search(exported)["length_penalty"] == 1.0


@pytest.mark.slow  # jaxformer's beam search compiled, and transformers' on a CPU: about 11 s
def test_an_exported_beam_search_generates_as_the_run_searches(opus_beam):
    """transformers' generate on the export, with nothing but the length limit given, finds the
    hypotheses that jaxformer's beam search finds with the run's decoding section."""
    _, workdir, exported = opus_beam
    decoding = load_checkpoint(workdir, params=False)[1].config["decoding"]
    keys = ("method", "beam_size", "alpha", "length_penalty", "stop")
    settings = DecodeSettings(**{key: decoding[key] for key in keys}, max_extra_length=MAX_EXTRA)
    assert settings.method == "beam" and settings.beam_size == 4  # the model's search, not greedy
    translator = Translator.from_workdir(workdir, settings=settings)
    model = MarianMTModel.from_pretrained(exported).eval()
    sources = [translator.tokenizer.encode(text) for text in sorted(sentences(40), key=len)[:4]]
    for source, hypotheses in zip(sources, translator.translate_ids(sources), strict=True):
        with torch.no_grad():
            output = model.generate(input_ids=torch.tensor([source]), max_new_tokens=len(source) + MAX_EXTRA)
        assert until_eos(hypotheses[0][0], 1) == until_eos(output[0, 1:].numpy(), 1)


def test_a_gnmt_run_exports_its_beam_without_the_penalty_transformers_lacks(opus_beam, tmp_path, caplog):
    """A run searching with gnmt's ((5 + |Y|) / 6)^alpha, jaxformer's default: generate gets its
    beam and stop rule, keeps its own length_penalty, and the export warns in one line."""
    _, workdir, _ = opus_beam
    step, metadata, params = load_checkpoint(workdir)
    decoding = {**metadata.config["decoding"], "length_penalty": "gnmt", "alpha": 0.6, "stop": "beam_full"}
    checkpointer = Checkpointer(RunDirectory(tmp_path / "gnmt").checkpoints, keep=None)
    checkpointer.save_params(step, params, metadata.replace(config={**metadata.config, "decoding": decoding}))
    checkpointer.close()
    with caplog.at_level(logging.WARNING):
        exported = export_marian(tmp_path / "gnmt", tmp_path / "exported")
    written = json.loads((exported / "generation_config.json").read_text())
    assert written["num_beams"] == 4 and written["early_stopping"] is True and "length_penalty" not in written
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "gnmt" in warnings[0] and "\n" not in warnings[0]


@pytest.mark.parametrize("stop", sorted(EARLY_STOPPING))
@pytest.mark.parametrize("form", ["transformers", "gnmt", None])
def test_each_beam_search_maps_to_generates_settings(stop, form):
    search, warning = exported_search(
        {"method": "beam", "beam_size": 6, "alpha": 0.6, "length_penalty": form, "stop": stop}, 1.3
    )
    expected = {"num_beams": 6, "early_stopping": EARLY_STOPPING[stop]}
    assert search == ({**expected, "length_penalty": 1.3} if form == "transformers" else expected)
    assert (warning is None) == (form == "transformers")  # None: a run from before the key, gnmt


def test_greedy_search_a_beam_of_one_and_sampling_set_no_search(tmp_path):
    assert exported_search({"method": "greedy", "beam_size": 4}, 0.6) == ({}, None)
    for decoding in ({"method": "sample"}, {"method": "beam", "beam_size": 1, "length_penalty": "transformers"}):
        search, warning = exported_search(decoding, 0.6)
        assert search == {} and "greedily" in warning
    # GenerationConfig refuses to save beam_full's early_stopping with a beam of 1, after all the export's work
    with pytest.raises(ValueError, match="early_stopping"):
        GenerationConfig(num_beams=1, early_stopping=True).save_pretrained(tmp_path)


@pytest.mark.parametrize(
    "settings, pad, start, unbanned",
    [
        ({"bad_words_ids": [[58100]]}, 58100, 58100, None),  # OPUS-MT's: pad is the decoder start
        ({"suppress_tokens": [58100]}, 58100, 58100, None),
        ({"bad_words_ids": [[0], [3]]}, 0, 3, None),  # --to_hf's
        ({}, 58100, 58100, "pad_token_id 58100"),
        ({"bad_words_ids": [[0]]}, 0, 3, "decoder_start_token_id 3"),
        ({"bad_words_ids": None, "suppress_tokens": []}, 0, 3, "pad_token_id 0 or decoder_start_token_id 3"),
    ],
)
def test_tokens_generate_may_output_and_jaxformer_never_does_are_named(settings, pad, start, unbanned):
    lines = unbanned_tokens(settings, pad, start, "g.json")
    assert len(lines) == (unbanned is not None)
    assert unbanned is None or lines[0].startswith(
        f"g.json: neither bad_words_ids nor suppress_tokens bans {unbanned}, "
    )


def test_an_import_whose_generate_may_output_pad_says_so(marian, tmp_path, capsys):
    """A directory whose generation config bans no pad (as save_pretrained writes one by default) lets
    generate output pad, which jaxformer's search never does: convert's message names it on a line
    of its own after the flags, and not once bad_words_ids bans it, as OPUS-MT's do."""
    directory = shutil.copytree(marian, tmp_path / "opus")
    model = MarianMTModel.from_pretrained(directory).eval()
    pad = model.config.pad_token_id
    with torch.no_grad():
        model.final_logits_bias[0, pad] += 10.0  # pad the likeliest token: generate outputs it unless banned
    model.save_pretrained(directory)
    source = torch.tensor([[5, 6, 7, 0]])
    unbanned = (
        f"{directory / 'generation_config.json'}: neither bad_words_ids nor suppress_tokens bans pad_token_id {pad}, "
    )
    for bad_words_ids in ([[pad]], None):  # write_marian's, OPUS-MT's; none, as save_pretrained writes by default
        generation = json.loads((directory / "generation_config.json").read_text())
        generation = {key: value for key, value in generation.items() if key != "bad_words_ids"}
        generation |= {"bad_words_ids": bad_words_ids} if bad_words_ids else {}
        (directory / "generation_config.json").write_text(json.dumps(generation))
        model.generation_config = GenerationConfig.from_pretrained(directory)  # as from_pretrained reads it
        with torch.no_grad():
            output = model.generate(input_ids=source, max_new_tokens=4)
        assert (pad in output[0, 1:].tolist()) == (bad_words_ids is None)  # transformers' side of it
        said = [line.startswith(unbanned) for line in read_marian_directory(directory).unreproduced]
        assert said == ([] if bad_words_ids else [True])  # was []
    capsys.readouterr()
    assert convert.main(["--from_hf", str(directory), "--output", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("by default with --method greedy") and lines[1].startswith(unbanned) and len(lines) == 2
