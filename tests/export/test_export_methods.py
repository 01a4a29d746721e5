"""jaxformer-export --method greedy and --method sample: serve.py translates as jaxformer-translate
does with the same settings (sampling: the same seed and batches give the same sentences), a
sampling export's seed, config.json's record of the search, and the refusals the export command
shares with translate. The beam search export (the default) is test_export.py's."""

import dataclasses
import hashlib
import io
import json
import shutil
import sys

import jax
import pytest

from jaxformer.commands import export, translate
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.export import exporter, standalone
from jaxformer.export.loading import ExportError, load_export
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_checkpoint
from tests.export.exports import FLAGS, export_with_the_command, sentences_in_two_batches
from tests.export.serving import run_serve_py

pytestmark = pytest.mark.xdist_group("export")  # the export fixture of conftest.py, made once

# FLAGS' lengths and batches, for a search without beams, exported for this machine only.
SEARCH_FLAGS = ["--max_extra_length", "8", "--batch_size", "4", "--max_source_tokens", "32"]
METHOD_FLAGS = {
    "greedy": ["--method", "greedy"],
    "sample": ["--method", "sample", "--temperature", "0.7", "--top_k", "20", "--seed", "5"],
}


@pytest.fixture(scope="module")
def method_exports(workdir):
    """{method: its export of workdir's best checkpoint}: greedy search and sampling (seed 5)."""
    exports = {}
    for method, flags in METHOD_FLAGS.items():
        exports[method] = workdir.parent / f"export-{method}"
        export_with_the_command(workdir, exports[method], [*flags, *SEARCH_FLAGS, "--platforms", "cpu"])
    return exports


@pytest.fixture(scope="module")
def text(workdir, tmp_path_factory):
    """Sentences in two batches of FLAGS' 4 rows, as a file to translate."""
    tokenizer = load_checkpoint(workdir, "best", params=False)[1].load_tokenizer()
    path = tmp_path_factory.mktemp("methods") / "sentences.en"
    path.write_text("".join(f"{sentence}\n" for sentence in sentences_in_two_batches(tokenizer)))
    return path


def translated_by_the_command(workdir, text, flags, output):
    """jaxformer-translate's output of `text` with `flags`, read from its --output file."""
    argv = ["--workdir", str(workdir), "--checkpoint", "best", "--input", str(text), "--output", str(output)]
    assert translate.main([*argv, "--no_progress", *flags]) == 0
    return output.read_text(encoding="utf-8")


# slow: "beam" (about 3 s, a serve.py process); covered in the default suite by tests/export/test_export.py's
# test_serve_py_without_jaxformer_equals_the_translator (the same beam export's serve.py and its command's
# lines against the Translator's).
@pytest.mark.parametrize("method", [pytest.param("beam", marks=pytest.mark.slow), "greedy", "sample"])
def test_serve_py_translates_as_jaxformer_translate_does(method, workdir, exported, method_exports, text, tmp_path):
    """The same settings, input and --batch_size: the same lines, sampling's drawn with the same keys."""
    directory = exported if method == "beam" else method_exports[method]
    served = run_serve_py(directory, input=text.read_text(encoding="utf-8"))
    flags = FLAGS if method == "beam" else [*METHOD_FLAGS[method], *SEARCH_FLAGS]
    expected = translated_by_the_command(workdir, text, flags, tmp_path / "translated.de")
    assert served.returncode == 0, served.stderr[-3000:]
    assert served.stdout == expected
    lines = expected.splitlines()
    assert len(lines) == 7 and lines[3] == "" and all(lines[:3] + lines[4:])  # the empty line stays empty
    if method == "sample":  # it drew: the greedy search's sentences are not what it gave
        greedy = run_serve_py(method_exports["greedy"], input=text.read_text(encoding="utf-8"))
        assert greedy.returncode == 0 and greedy.stdout != served.stdout


def test_config_json_records_the_search_and_its_program(method_exports):
    greedy, sample = (json.loads((method_exports[m] / "config.json").read_text()) for m in ("greedy", "sample"))
    # Version 2: a loader of version 1 (before greedy search and sampling) refuses it by its version.
    assert greedy["format_version"] == sample["format_version"] == 2
    assert greedy["decoding"] == {"method": "greedy", "max_extra_length": 8, "renormalize_after_bans": False}
    assert sample["decoding"] == {
        "method": "sample",
        "max_extra_length": 8,
        "renormalize_after_bans": False,
        "temperature": 0.7,
        "top_k": 20,
        "seed": 5,
    }
    assert sample["program"]["key_impl"] == "threefry2x32" and "key_impl" not in greedy["program"]
    for config, name, inputs in (
        (greedy, "greedy_search.jaxexport", ["int32[B,S]"]),
        (sample, "sampling.jaxexport", ["int32[B,S]", "uint32[2]"]),
    ):
        directory = method_exports[config["decoding"]["method"]]
        assert config["files"]["program"]["name"] == name and (directory / name).is_file()
        assert not (directory / "beam_search.jaxexport").exists()
        program = jax.export.deserialize(bytearray((directory / name).read_bytes()))
        assert [str(aval) for aval in program.in_avals[-len(inputs) :]] == inputs
        assert [str(aval) for aval in program.out_avals] == ["int32[B,1,S + 8]", "float32[B,1]"]


def test_a_sampling_exports_seed_reproduces_and_each_call_draws_anew(method_exports, text):
    directory = method_exports["sample"]
    sentences = text.read_text(encoding="utf-8").splitlines()
    model = load_export(directory)  # config.json's seed, 5
    first = model.translate(sentences)
    assert model.translate(sentences) != first  # the next keys: a second call draws anew
    assert load_export(directory).translate(sentences) == first  # a fresh load from the same seed
    assert load_export(directory, seed=5).translate(sentences) == first
    other = load_export(directory, seed=6).translate(sentences)
    assert other != first
    for _ in range(2):  # serve.py --seed: the same each run, its lines those of the loader with that seed
        served = run_serve_py(directory, "--seed", "6", input=text.read_text(encoding="utf-8"))
        assert served.returncode == 0, served.stderr[-3000:]
        assert served.stdout.splitlines() == other


def test_a_seed_is_refused_where_nothing_is_drawn_or_out_of_range(exported, method_exports):
    for directory, flags, message in (
        (exported, ["--seed", "3"], "seed 3: this export's program is beam search, which draws nothing"),
        (method_exports["greedy"], ["--seed", "0"], "seed 0: this export's program is greedy search"),
        (method_exports["sample"], ["--seed", str(2**32)], "seed must be an integer from 0 to 4294967295, got"),
        (method_exports["sample"], ["--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    ):
        result = run_serve_py(directory, *flags, input="A man.\n", timeout=120)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1, result.stderr
    with pytest.raises(ValueError, match="seed 3: this export's program is beam search"):
        load_export(exported, seed=3)


def test_a_seed_is_refused_before_the_export_is_read(exported, method_exports, monkeypatch, capsys):
    """From config.json alone: serve.py --seed and load(seed=) on a beam export, or a seed out of a
    key's range, read no parameter, tokenizer or program (a large model's seconds of reading)."""
    monkeypatch.setattr(standalone.export_files, "read_verified", lambda *args: pytest.fail("the export was read"))
    for directory, seed, message in (
        (exported, 3, "seed 3: this export's program is beam search, which draws nothing"),
        (method_exports["greedy"], 0, "seed 0: this export's program is greedy search, which draws nothing"),
        (method_exports["sample"], 2**32, "seed must be an integer from 0 to 4294967295, got 4294967296"),
    ):
        with pytest.raises(ValueError, match=message):
            load_export(directory, seed=seed)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"A man.\n")))
        capsys.readouterr()
        assert standalone.main([str(directory), "--seed", str(seed)]) == 2
        assert capsys.readouterr().err.startswith(f"error: {message};" if "draws" in message else f"error: {message}\n")


def _refusal(main, argv, capsys):
    """(exit status, stderr's last line) of a command refusing `argv`, argparse's refusals included."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--method", "greedy", "--beam_size", "3"], "error: --beam_size 3 applies to --method beam, not greedy"),
        (["--method", "sample", "--stop", "exact"], "error: --stop exact applies to --method beam, not sample"),
        (["--temperature", "0.5"], "error: --temperature 0.5 applies to --method sample, not beam"),
        (["--method", "greedy", "--seed", "3"], "error: --seed 3 applies to --method sample, not greedy"),
        (["--method", "sample", "--top_k", "600"], "error: top_k=600 is more than the model's 500 tokens"),
        (["--beam_size", "600"], "error: beam_size=600 is more than the model's 500 tokens"),
        (["--method", "sample", "--temperature", "0"], "argument --temperature: must be"),
        (["--method", "nucleus"], "argument --method: invalid choice: 'nucleus'"),
    ],
)
def test_the_export_refuses_what_translate_refuses_in_its_words(workdir, text, tmp_path, capsys, flags, message):
    """Before any parameter is read, nothing written: each flag of another search, or a top_k
    wider than the vocabulary, in one line, the same as jaxformer-translate's."""

    common = ["--workdir", str(workdir), "--checkpoint", "best", *flags]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Checkpointer, "_restore_params", lambda *args: pytest.fail("the parameters were read"))
        refused = _refusal(export.main, [*common, "--output", str(tmp_path / "out")], capsys)
    translated = _refusal(translate.main, [*common, "--input", str(text), "--output", str(tmp_path / "t")], capsys)
    assert refused == translated and refused[0] == 2 and message in refused[1], refused
    assert not (tmp_path / "out").exists() and not (tmp_path / "t").exists()


def test_export_checkpoint_refuses_a_seed_no_key_takes(workdir, tmp_path):
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 4294967295, got 4294967296"):
        exporter.export_checkpoint(workdir, tmp_path / "out", "best", DecodeSettings(method="sample"), seed=2**32)
    assert not (tmp_path / "out").exists()


def test_a_program_of_another_search_of_the_same_shapes_is_named(workdir, method_exports, tmp_path):
    """A beam search of beam size 1 and greedy search take and return the same shapes: a program of
    one put in the other's export (config.json's files.program edited to it) is named by the search
    its function was exported as."""
    beam = tmp_path / "beam-1"
    export_with_the_command(workdir, beam, ["--beam_size", "1", *SEARCH_FLAGS, "--platforms", "cpu"])
    for into, source, expected in (
        (
            method_exports["greedy"],
            beam,
            "decoding.method is 'greedy', but {} is the program of 'beam' (its function, beam_search)",
        ),
        (
            beam,
            method_exports["greedy"],
            "decoding.method is 'beam', but {} is the program of 'greedy' (its function, greedy_search)",
        ),
    ):
        copy = tmp_path / f"{into.name}-with-{source.name}"
        shutil.copytree(into, copy)
        config = json.loads((copy / "config.json").read_text())
        name = json.loads((source / "config.json").read_text())["files"]["program"]["name"]
        (copy / config["files"]["program"]["name"]).unlink()
        shutil.copy(source / name, copy / name)
        config["files"]["program"] = {"name": name, "sha256": hashlib.sha256((copy / name).read_bytes()).hexdigest()}
        (copy / "config.json").write_text(json.dumps(config))
        with pytest.raises(ExportError) as error:
            load_export(copy)
        assert str(error.value) == f"{copy / 'config.json'}: {expected.format(copy / name)}"


SAMPLING = {"method": "sample", "max_extra_length": 8, "temperature": 1.0, "top_k": 0, "seed": 0}
GREEDY = {"method": "greedy", "max_extra_length": 8}
KEY = {"key_impl": "threefry2x32"}


def _edited(source, tmp_path, edit):
    """A copy of the export `source` whose config.json `edit(config)` changed."""
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    "export, edit, message",
    [
        ("sample", lambda c: c["decoding"].update(method="nucleus"), "decoding.method is 'nucleus'; it must be one of"),
        ("sample", lambda c: c.update(decoding=GREEDY), "{program} is not the program of decoding.method"),
        (  # the sampling settings left beside it: no greedy export holds them
            "sample",
            lambda c: c["decoding"].update(method="greedy"),
            "unknown key 'decoding.temperature', which this loader does not read; a greedy export's decoding takes",
        ),
        ("greedy", lambda c: c["decoding"].update(method="sample"), "decoding.top_k is None; it must be an integer"),
        ("greedy", lambda c: c.update(decoding=SAMPLING, program=KEY), "{program} is not the program of decoding."),
        ("greedy", lambda c: c["decoding"].update(method="beam"), "decoding.beam_size is None; it must be an integer"),
        ("beam", lambda c: c["decoding"].update(method="greedy"), "'greedy' in export format version 1, which holds"),
        ("greedy", lambda c: c.update(format_version=1), "decoding.method is 'greedy' in export format version 1"),
        (
            "sample",
            lambda c: c.update(format_version=3),
            "has export format version 3; this loader reads versions 1 to 2",
        ),
        ("beam", lambda c: c.update(format_version=True), "has export format version True; this loader reads"),
        ("sample", lambda c: c["decoding"].update(seed=2**32), "decoding.seed is 4294967296; it must be at most"),
        ("sample", lambda c: c["decoding"].update(seed="5"), "decoding.seed is '5'; it must be an integer >= 0"),
        ("sample", lambda c: c["decoding"].update(temperature=0), "decoding.temperature is 0; it must be a finite"),
        # float32 cannot hold it: the program would divide the logits by inf and draw every token alike.
        (
            "sample",
            lambda c: c["decoding"].update(temperature=1e39),
            "decoding.temperature is 1e+39; it must be a finite number > 0 that float32 holds (at most 3.4028235e+38)",
        ),
        ("sample", lambda c: c["program"].pop("key_impl"), "program.key_impl is None, not the name of a jax random"),
        ("sample", lambda c: c["program"].update(key_impl="nope"), "program.key_impl is 'nope', a random key impl"),
        ("sample", lambda c: c["program"].update(key_impl="rbg"), "{program} takes a key uint32[2], not the uint32[4]"),
    ],
)
def test_an_edited_search_in_config_json_is_named(exported, method_exports, tmp_path, export, edit, message):
    copy = _edited(exported if export == "beam" else method_exports[export], tmp_path, edit)
    program = copy / json.loads((copy / "config.json").read_text())["files"]["program"]["name"]
    with pytest.raises(ExportError) as error:
        load_export(copy)
    expected = message.replace("{program}", str(program))
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert str(error.value).startswith(str(copy)), str(error.value)


def test_an_exports_temperature_rule_is_jaxformers():
    """export_files.py's twin of generate.TEMPERATURE_RULE and is_valid_temperature (an export
    cannot import jaxformer) says and allows what they do."""
    from jaxformer.decoding import generate
    from jaxformer.export import export_files

    assert export_files.TEMPERATURE_RULE == generate.TEMPERATURE_RULE
    for value in (0.7, 1, 3.4e38, 1e-45, 0, -1.0, 1e39, 10**39, 10**400, float("inf"), float("nan")):
        assert export_files.is_valid_temperature(value) == generate.is_valid_temperature(value), value


@pytest.mark.parametrize(
    "export, key, value, message",
    [
        ("sample", "top_k", 5, "decoding.top_k is 5, but {program} samples with top_k 20, fixed when it was exported"),
        ("sample", "temperature", 1.5, "decoding.temperature is 1.5, but {program} samples with temperature 0.7,"),
        ("sample", "renormalize_after_bans", True, "is true, but {program} samples with renormalize_after_bans false"),
        ("greedy", "renormalize_after_bans", True, "is true, but {program} searches with renormalize_after_bans false"),
        ("beam", "alpha", 1.0, "decoding.alpha is 1.0, but {program} searches with alpha 0.6, fixed when it was"),
        ("beam", "alpha", None, "decoding.alpha is absent, but {program} searches with alpha 0.6"),
        ("beam", "stop", "exact", 'decoding.stop is "exact", but {program} searches with stop "current_length"'),
        ("beam", "length_penalty", "transformers", 'is "transformers", but {program} searches with length_penalty'),
        (
            "beam",
            "top_k",
            5,
            "decoding.top_k is 5, but {program} is a beam search, which does not sample (exported with top_k 0); "
            "export with --method sample to sample",
        ),
        ("beam", "temperature", 0.5, "decoding.temperature is 0.5, but {program} is a beam search, which does not"),
    ],
)
def test_a_decoding_value_the_program_fixes_is_refused_when_edited(
    exported, method_exports, tmp_path, export, key, value, message
):
    """config.json's decoding values the program was exported with (its function's name records
    them) loaded when edited and changed nothing: a sampling export's top_k, a beam search's alpha."""
    directory = exported if export == "beam" else method_exports[export]
    edit = (lambda c: c["decoding"].pop(key)) if value is None else (lambda c: c["decoding"].update({key: value}))
    copy = _edited(directory, tmp_path, edit)
    program = copy / json.loads((copy / "config.json").read_text())["files"]["program"]["name"]
    with pytest.raises(ExportError) as error:
        load_export(copy)
    text = str(error.value)
    assert text.startswith(f"{copy / 'config.json'}: decoding.{key} is ") and "\n" not in text, text
    assert message.replace("{program}", str(program)) in text, text
    sampling_in_a_beam_search = export == "beam" and key in ("temperature", "top_k")
    assert text.endswith("--method sample to sample" if sampling_in_a_beam_search else "; export again to change it")


def test_a_sampling_exports_seed_stays_editable(method_exports, tmp_path):
    """The seed is no setting of the program (each batch's key is an input): config.json's is the default."""
    copy = _edited(method_exports["sample"], tmp_path, lambda c: c["decoding"].update(seed=6))
    edited, given = load_export(copy), load_export(method_exports["sample"], seed=6)
    assert (jax.random.key_data(edited._rng) == jax.random.key_data(given._rng)).all()


def test_a_program_that_records_no_settings_loads_them_unchecked(method_exports, tmp_path):
    """An export written before its program's function name recorded its settings ("sampling") loads,
    its config.json's decoding values unchecked against the program."""
    copy = _edited(method_exports["sample"], tmp_path, lambda c: c["decoding"].update(top_k=5))
    path = copy / "sampling.jaxexport"
    program = jax.export.deserialize(bytearray(path.read_bytes()))
    assert program.fun_name.startswith("sampling {") and '"top_k": 20' in program.fun_name
    path.write_bytes(dataclasses.replace(program, fun_name="sampling").serialize())
    config = json.loads((copy / "config.json").read_text())
    config["files"]["program"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (copy / "config.json").write_text(json.dumps(config))
    assert load_export(copy).config["decoding"]["top_k"] == 5
