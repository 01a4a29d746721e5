"""Hugging Face MarianMT interop (jaxformer/interop/marian.py) against transformers itself: a tiny
random MarianMT model made and saved with transformers, imported as a jaxformer run, must give
transformers' teacher-forced logits, greedy and beam-4 outputs and MarianTokenizer's ids; a
jaxformer run exported the other way must load in transformers and give jaxformer's."""

import json
import shutil

import jaxtyping
import numpy as np
import pytest

from tests.conftest import make_workdir, read_raw

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import MarianMTModel, MarianTokenizer  # noqa: E402

from jaxformer.decoding.generate import DecodeSettings  # noqa: E402
from jaxformer.decoding.translator import Translator  # noqa: E402
from jaxformer.interop import marian_files  # noqa: E402
from jaxformer.interop.marian import ConversionError, import_marian  # noqa: E402
from jaxformer.interop.marian_export import export_marian  # noqa: E402
from jaxformer.interop.marian_layout import marian_to_jaxformer_ids  # noqa: E402
from jaxformer.run.loading import load_checkpoint  # noqa: E402
from tests.interop.marian_models import (  # noqa: E402
    ALPHA,
    MAX_EXTRA,
    check_export_matches_run,
    hf_generate,
    sentences,
    teacher_forced_logits,
    until_eos,
    write_marian,
)

pytestmark = pytest.mark.xdist_group("interop")  # the module's models are built once


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A saved tiny MarianMT directory (swish, nonzero final_logits_bias) and its model."""
    directory = tmp_path_factory.mktemp("marian")
    return directory, write_marian(directory)


@pytest.fixture(scope="module")
def imported(marian, tmp_path_factory):
    directory, _ = marian
    workdir = tmp_path_factory.mktemp("imported") / "run"
    converted = import_marian(directory, workdir)
    return workdir, converted


# -- transformers -> jaxformer ----------------------------------------------------------------


def test_tokenization_matches_marian_tokenizer(marian, imported):
    directory, _ = marian
    workdir, converted = imported
    tokenizer = MarianTokenizer.from_pretrained(directory)
    to_jaxformer = marian_to_jaxformer_ids(converted.order)
    english, german = sentences(50), read_raw("val.de.gz")[:50]
    source_ids = tokenizer(english)["input_ids"]
    target_ids = tokenizer(text_target=german)["input_ids"]
    translator = Translator.from_workdir(workdir)
    for text, ids in zip(english, source_ids, strict=True):
        np.testing.assert_array_equal(translator.tokenizer.encode(text), to_jaxformer[ids])
    for text, ids in zip(german, target_ids, strict=True):
        np.testing.assert_array_equal(translator.target_tokenizer.encode(text), to_jaxformer[ids])
        if tokenizer.unk_token_id not in ids:  # MarianTokenizer drops <unk> from its text, sentencepiece shows " ⁇ "
            decoded = tokenizer.decode(ids, skip_special_tokens=True)
            assert translator.target_tokenizer.decode(to_jaxformer[ids]) == decoded


def test_a_run_fine_tuned_from_an_import_translates_during_training_with_transformers_length_penalty(imported):
    from jaxformer.training.experiment import default_config
    from jaxformer.training.init_from import load_starting_points
    from jaxformer.training.run_start import settle_inherited_decoding

    workdir, _ = imported
    assert load_checkpoint(workdir, params=False)[1].config["decoding"]["length_penalty"] == "transformers"
    config = default_config()
    config.training.init_from = str(workdir)
    (start,) = load_starting_points(config.training)
    settle_inherited_decoding(config, None, start)  # as the fine-tuning run's start does (run_start.prepare_run)
    assert config.decoding.length_penalty == "transformers"
    assert config.decoding.renormalize_after_bans is False  # the model's generation config does not renormalize


def test_an_import_of_a_presets_sizes_is_labelled_with_that_preset(imported):
    """It was labelled base on tiny's sizes, a section config_rules.preset_held_instead refuses."""
    workdir, _ = imported
    assert load_checkpoint(workdir, params=False)[1].config["model"]["preset"] == "tiny"


def test_teacher_forced_logits_match(marian, imported):
    directory, model = marian
    workdir, converted = imported
    logits, expected = teacher_forced_logits(directory, model, workdir, converted.order)
    marian_ids = np.arange(converted.config.vocab_size) != 3  # BOS's column has no Marian counterpart
    assert np.abs(logits[:, marian_ids] - expected[:, marian_ids]).max() < 1e-4
    assert (logits[:, 3] < expected[:, 3] - 99).all()  # and no probability


def transformers_search(beam_size, stop="current_length", renormalize=False):
    """The search of transformers' generate as hf_generate runs it, greedy for a beam of 1."""
    return DecodeSettings(
        method="greedy" if beam_size == 1 else "beam",
        beam_size=beam_size,
        alpha=ALPHA,
        length_penalty="transformers",
        max_extra_length=MAX_EXTRA,
        stop=stop,
        renormalize_after_bans=renormalize,
    )


def short_sources(directory, converted):
    """Five short validation sentences in MarianTokenizer's ids, and in the import's (`converted`)."""
    tokenizer = MarianTokenizer.from_pretrained(directory)
    texts = sorted(sentences(40), key=len)[:5]  # short ones: transformers' search is slow on a CPU
    sources = [tokenizer(text)["input_ids"] for text in texts]
    to_jaxformer = marian_to_jaxformer_ids(converted.order)
    return sources, [to_jaxformer[ids].astype(np.int32) for ids in sources]


# jaxformer's beam stop rules and transformers' early_stopping values for the same rule.
STOPS = {"exact": "never", "current_length": False, "beam_full": True}


# Beam 4 with the exact stop (about 6 s) under -m slow: the default stop and beam_full stay in the default suite.
@pytest.mark.parametrize(
    ("beam_size", "stop"),
    [(1, "exact"), pytest.param(4, "exact", marks=pytest.mark.slow), (4, "current_length"), (4, "beam_full")],
)
def test_search_matches_transformers_generate(marian, imported, beam_size, stop):
    """Greedy search, and beam search with transformers' length penalty |Y|^alpha under each
    stop rule: transformers with early_stopping="never" keeps expanding until no live beam can
    beat the worst kept hypothesis under its longest reachable length, as jaxformer's "exact"
    does; False and True are "current_length" and "beam_full". Forced EOS at the length limit and
    the pad token banned (bad_words_ids) as jaxformer's limits and banned ids. jaxformer decodes
    the sentences in one batch, transformers one at a time."""
    directory, model = marian
    workdir, converted = imported
    translator = Translator.from_workdir(workdir, settings=transformers_search(beam_size, stop))
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    sources, ids = short_sources(directory, converted)
    results = translator.translate_ids(ids)
    lengths = []
    for source, hypotheses in zip(sources, results, strict=True):
        limit = len(source) + MAX_EXTRA
        expected, expected_scores = hf_generate(model, source, limit, beam_size, pad, pad, eos, [pad], STOPS[stop])
        ours = [[int(converted.order[token]) for token in until_eos(tokens, 1)] for tokens, _ in hypotheses]
        assert ours == expected
        if expected_scores is not None:  # the same scores, but for hypotheses cut at the limit, whose forced
            # EOS transformers scores log p = 0 and jaxformer its real log p(EOS)
            ended = np.asarray([len(sequence) < limit for sequence in expected])
            scores = np.asarray([score for _, score in hypotheses])
            np.testing.assert_allclose(scores[ended], expected_scores[ended], rtol=1e-4, atol=1e-4)
        lengths += [len(sequence) for sequence in expected]
    assert len(set(lengths)) > 2  # outputs of several lengths, not all cut at the limit


@pytest.mark.parametrize(
    ("generation", "expected"),
    [
        ({}, {"method": "greedy"}),  # generate's default: num_beams 1
        (
            {"num_beams": 4, "length_penalty": 0.6, "early_stopping": "never"},
            {"method": "beam", "beam_size": 4, "alpha": 0.6, "length_penalty": "transformers", "stop": "exact"},
        ),
        (  # OPUS-MT's: length_penalty and early_stopping at generate's defaults, 1.0 and False
            {"num_beams": 5},
            {
                "method": "beam",
                "beam_size": 5,
                "alpha": 1.0,
                "length_penalty": "transformers",
                "stop": "current_length",
            },
        ),
        (  # sampling: it gave --method greedy, or beam flags with num_beams
            {"do_sample": True, "temperature": 0.7, "top_k": 5, "num_beams": 1},
            {"method": "sample", "temperature": 0.7, "top_k": 5},
        ),
        ({"do_sample": True}, {"method": "sample", "temperature": 1.0, "top_k": 50}),  # generate's default top_k
        ({"do_sample": True, "top_k": 10**6}, {"method": "sample", "top_k": 0}),  # more than the model's tokens: all
    ],
)
def test_convert_names_the_flags_that_search_as_the_models_generate_does(
    marian, tmp_path, capsys, generation, expected
):
    """The flags convert's message gives are, read by jaxformer-translate, the search that
    transformers' generate runs with the model's generation_config.json (STOPS: the same search
    under test_search_matches_transformers_generate); it said --length_penalty transformers alone,
    which beam-searches with alpha 0.6 whatever the model's num_beams and length_penalty."""
    from jaxformer.commands import convert, decoding_flags, translate

    directory = shutil.copytree(marian[0], tmp_path / "marian")
    settings = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**settings, **generation}))
    assert convert.main(["--from_hf", str(directory), "--output", str(tmp_path / "run")]) == 0
    message = capsys.readouterr().out.strip()
    flags = message.split("decode it as transformers' generate does by default with ")[1].split()
    args = translate.build_parser().parse_args(["--workdir", str(tmp_path / "run"), *flags])
    decoding_flags.check_search_flags(args)
    found = decoding_flags.decode_settings_from_flags(args, MAX_EXTRA)
    assert {key: getattr(found, key) for key in expected} == expected
    if found.method == "beam":
        assert STOPS[found.stop] == generation.get("early_stopping", False)


# How far pad's output bias is raised in the `renormalized` model: pad then takes a large share of
# every step's probability, which transformers' renormalize_logits gives back to the other tokens.
PAD_BIAS = 4.0


@pytest.fixture(scope="module")
def renormalized(marian, tmp_path_factory):
    """The `marian` model with pad made likely, saved with renormalize_logits=true in its
    generation_config.json (as opus-mt-en-jap's), its transformers model, and its import."""
    directory = tmp_path_factory.mktemp("renormalized") / "marian"
    shutil.copytree(marian[0], directory)
    model = MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        model.final_logits_bias[0, model.config.pad_token_id] += PAD_BIAS
    model.generation_config.renormalize_logits = True
    model.save_pretrained(directory)
    workdir = tmp_path_factory.mktemp("renormalized-run") / "run"
    return directory, model, workdir, import_marian(directory, workdir)


def test_renormalize_logits_is_imported_as_the_runs_search_and_exported_back(renormalized, tmp_path, capsys):
    from jaxformer.commands import convert

    directory, _, workdir, converted = renormalized
    assert json.loads((directory / "generation_config.json").read_text())["renormalize_logits"] is True
    assert converted.renormalize_after_bans
    assert load_checkpoint(workdir, params=False)[1].config["decoding"]["renormalize_after_bans"] is True
    assert convert.main(["--from_hf", str(directory), "--output", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.endswith(
        "decode it as transformers' generate does by default with --method greedy --renormalize_after_bans true\n"
    )
    exported = export_marian(workdir, tmp_path / "hf")  # --to_hf writes it back: transformers searches as the run
    assert json.loads((exported / "generation_config.json").read_text())["renormalize_logits"] is True
    assert marian_files.read_marian_directory(exported).renormalize_logits


@pytest.mark.slow  # transformers' beam search on a CPU: about 10 s
@pytest.mark.parametrize("beam_size", [1, 4])
def test_renormalized_search_matches_transformers_generate(renormalized, beam_size):
    """With renormalize_logits=True transformers scores each step over the tokens left after its
    bans (pad, and all but EOS at the length limit, whose forced EOS then costs 0): the import's
    search (decoding.renormalize_after_bans) gives its hypotheses and scores, those cut at the limit
    included; log p under the model (the option off) gives other scores."""
    directory, model, workdir, converted = renormalized
    translator = Translator.from_workdir(workdir, settings=transformers_search(beam_size, renormalize=True))
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    sources, ids = short_sources(directory, converted)
    results = translator.translate_ids(ids)
    plain = translator.with_settings(transformers_search(beam_size)).translate_ids(ids)
    plain_differences, other_lists, at_limit = [], [], []
    for source, hypotheses, plain_hypotheses in zip(sources, results, plain, strict=True):
        limit = len(source) + MAX_EXTRA
        expected, expected_scores = hf_generate(
            model, source, limit, beam_size, pad, pad, eos, [pad], early_stopping=False, renormalize=True
        )
        in_marian_ids = [
            [[int(converted.order[token]) for token in until_eos(tokens, 1)] for tokens, _ in found]
            for found in (hypotheses, plain_hypotheses)
        ]
        assert in_marian_ids[0] == expected
        np.testing.assert_allclose([score for _, score in hypotheses], expected_scores, rtol=1e-4, atol=1e-4)
        plain_differences += [abs(score - hf) for (_, score), hf in zip(plain_hypotheses, expected_scores)]
        other_lists.append(in_marian_ids[1] != expected)
        at_limit += [len(sequence) == limit for sequence in expected]
    assert min(plain_differences) > 0.1  # without the option every score is another: the test can fail
    assert beam_size == 1 or any(other_lists)  # and beam search keeps other hypotheses
    assert any(at_limit) and (beam_size == 1 or not all(at_limit))  # the free EOS at the limit, and the others


# -- jaxformer -> transformers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("jaxformer-run"))
    directory = export_marian(workdir, tmp_path_factory.mktemp("exported") / "marian")
    return workdir, directory


def test_to_hf_names_a_step_as_translate_and_export_name_it(exported, tmp_path, capsys):
    """--to_hf --checkpoint 1 said 'wrote the 1 checkpoint of W', where translate and export say
    'checkpoint 1' (run.directory.checkpoint_name)."""
    from jaxformer.commands import convert

    workdir, _ = exported
    output = tmp_path / "hf"
    assert convert.main(["--to_hf", str(workdir), "--checkpoint", "1", "--output", str(output)]) == 0
    expected = f"wrote {workdir} (checkpoint 1) to {output} (transformers MarianMT)"
    assert capsys.readouterr().out.splitlines()[-1] == expected


def test_max_positions_reach_the_tokenizer(exported, tmp_path):
    """MarianTokenizer truncates to model_max_length: it kept 512 under --max_positions 16, and
    transformers then failed on longer inputs."""
    directory = export_marian(exported[0], tmp_path / "short", max_positions=16)
    assert json.loads((directory / "config.json").read_text())["max_position_embeddings"] == 16
    assert json.loads((directory / "tokenizer_config.json").read_text())["model_max_length"] == 16
    tokenizer = MarianTokenizer.from_pretrained(directory)
    assert len(tokenizer("a " * 40, truncation=True)["input_ids"]) == 16


def test_an_exported_run_reads_back_in(exported):
    """--to_hf then --from_hf: what jaxformer writes (bad_words_ids [[pad], [decoder start]], the two
    tokens its search never produces) passes every check of the reader, and gives the run's model."""
    workdir, directory = exported
    read = marian_files.read_marian_directory(directory)
    assert json.loads((directory / "generation_config.json").read_text())["bad_words_ids"] == [[0], [3]]
    _, metadata, _ = load_checkpoint(workdir, params=False)
    converted = marian_files.model_config_from_marian(read.config, "config.json")
    assert (converted.d_model, converted.num_heads) == (metadata.model["d_model"], metadata.model["num_heads"])


def test_exported_run_loads_in_transformers_with_the_same_outputs(exported):
    workdir, directory = exported
    check_export_matches_run(directory, workdir)


def test_export_refuses_what_marian_cannot_hold(exported, tmp_path):
    workdir, directory = exported
    with pytest.raises(ConversionError, match="not an empty directory"):
        export_marian(workdir, directory)


def test_convert_command_writes_a_run_and_never_overwrites(marian, tmp_path, capsys):
    from jaxformer.commands import convert
    from jaxformer.errors import EXIT_USER_ERROR
    from jaxformer.run.loading import load_checkpoint

    directory, _ = marian
    output = tmp_path / "run"
    for flags, message in (
        (["--checkpoint", "best"], "--checkpoint applies to --to_hf, not --from_hf"),
        (["--max_positions", "7"], "--max_positions applies to --to_hf, not --from_hf"),
    ):
        assert convert.main(["--from_hf", str(directory), "--output", str(output), *flags]) == EXIT_USER_ERROR
        assert capsys.readouterr().err == f"error: {message}\n"
    assert convert.main(["--to_hf", str(tmp_path), "--output", "o", "--source_language", "fr"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == "error: --source_language applies to --from_hf, not --to_hf\n"
    assert not output.exists() and not (tmp_path / "o").exists()
    assert convert.main(["--from-hf", str(directory), "--output", str(output)]) == 0  # the earlier spelling
    step, metadata, _ = load_checkpoint(output)
    assert step == 0 and metadata.config["tokenizer"]["separate_vocabularies"]
    assert metadata.config["data"]["source_language"] == "en" and metadata.config["data"]["target_language"] == "de"
    assert (output / "tokenizer.model").is_file() and (output / "tokenizer.target.model").is_file()
    capsys.readouterr()
    assert convert.main(["--from_hf", str(directory), "--output", str(output)]) == EXIT_USER_ERROR
    assert "not an empty directory" in capsys.readouterr().err


@pytest.mark.slow  # the commands on an imported run; the import is checked above
def test_the_imported_run_translates_and_exports_through_the_commands(imported, tmp_path, capsys, monkeypatch):
    from jaxformer.commands import export, translate
    from jaxformer.export.loading import load_export

    workdir, _ = imported
    lines = sentences(4, offset=30)
    (tmp_path / "input.en").write_text("\n".join(lines) + "\n")
    flags = ["--workdir", str(workdir), "--length_penalty", "transformers", "--max_extra_length", "8"]
    assert translate.main([*flags, "--input", str(tmp_path / "input.en"), "--output", str(tmp_path / "out.de")]) == 0
    settings = DecodeSettings(length_penalty="transformers", max_extra_length=8)
    expected = Translator.from_workdir(workdir, settings=settings).translate(lines)
    assert (tmp_path / "out.de").read_text().splitlines() == expected

    # jax.export's symbolic sizes are not the ints the test session's shape checks expect (see
    # tests/export/conftest.py); a user's export runs without those checks.
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)
    exported = tmp_path / "export"
    assert export.main([*flags, "--output", str(exported), "--platforms", "cpu"]) == 0
    assert load_export(exported).translate(lines) == expected


def test_every_activation_maps_to_transformers_own_function_both_ways():
    from transformers.activations import ACT2FN

    from jaxformer.interop.marian import ACTIVATIONS
    from jaxformer.interop.marian_export import marian_config
    from jaxformer.model.config import preset
    from jaxformer.model.layers import activation_function

    x = np.linspace(-6.0, 6.0, 49, dtype=np.float32)
    for marian_name, ours in ACTIVATIONS.items():
        want = ACT2FN[marian_name](torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(activation_function(ours)(x), want, rtol=1e-5, atol=1e-6, err_msg=marian_name)
        exported = marian_config(preset("tiny", activation=ours))["activation_function"]
        assert ACTIVATIONS[exported] == ours
