"""jaxformer-export: the directory it writes, serving it without jaxformer, Translator.from_export,
and the command's refusals (overwriting, bad flags, a language model). A damaged export is in
test_export_damage.py, serve.py's command line in test_serve_command_line.py."""

import hashlib
import json
import os
import pathlib
import re
import shutil

import jax
import numpy as np
import pytest

from jaxformer import argument_parser
from jaxformer.commands import export
from jaxformer.data import text_lines, unmarked_wide_text
from jaxformer.decoding import sentence_batches
from jaxformer.decoding.generate import DecodeSettings, decoding_variant, make_generate_fn
from jaxformer.decoding.translator import Translator
from jaxformer.export import export_files, export_program, exported_translator, exporter, serve_streams, standalone
from jaxformer.export.loading import ExportError, load_export
from jaxformer.export.safetensors import flatten, read_safetensors
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from tests.conftest import assert_same_hypotheses
from tests.export.exports import FLAGS, sentences_in_two_batches
from tests.export.serving import serve_without_jaxformer

pytestmark = pytest.mark.xdist_group("export")

SETTINGS = DecodeSettings(beam_size=3, max_extra_length=8)  # the export's (conftest.py's FLAGS)

SERVE = """
import io, json, pathlib, runpy
import numpy as np

directory, results = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
sys.path.insert(0, str(directory))
import serve

model = serve.load(directory)
sentences = json.loads((results / "sentences.json").read_text())
nbest = model.translate_nbest(sentence for sentence in sentences)  # any iterable, as Translator takes
sources = np.load(results / "sources.npz")
outputs = {}
for name in sources.files:
    outputs[f"{name}_tokens"], outputs[f"{name}_scores"] = model.translate_ids(sources[name])
np.savez(results / "outputs.npz", **outputs)

# The command line, as `python serve.py < sentences > translations` runs it.
sys.stdin = io.TextIOWrapper(io.BytesIO(("\\n".join(sentences) + "\\n").encode("utf-8")), encoding="utf-8")
printed, sys.stdout = sys.stdout, io.StringIO()
sys.argv = [str(directory / "serve.py")]  # the directory defaults to the script's own
try:
    runpy.run_path(str(directory / "serve.py"), run_name="__main__")
except SystemExit as stop:
    assert not stop.code, stop.code
command_output, sys.stdout = sys.stdout.getvalue(), printed

loaded = sorted(name for name, module in sys.modules.items() if name.startswith("jaxformer") and module is not None)
(results / "results.json").write_text(json.dumps({"nbest": nbest, "command": command_output, "loaded": loaded}))
"""


@pytest.fixture(scope="module")
def translator(workdir):
    return Translator.from_workdir(workdir, "best", settings=SETTINGS, batch_size=4, max_source_tokens=32)


@pytest.fixture(scope="module")
def sentences(translator):
    return sentences_in_two_batches(translator.tokenizer)


def test_the_directory_holds_everything_serving_needs(exported, workdir):
    assert sorted(os.listdir(exported)) == [
        "argument_parser.py",
        "beam_search.jaxexport",
        "config.json",
        "export_files.py",
        "export_program.py",
        "exported_translator.py",
        "params.safetensors",
        "sentence_batches.py",
        "serve.py",
        "serve_streams.py",
        "text_lines.py",
        "tokenizer.model",
        "unmarked_wide_text.py",
    ]
    assert not [name for name in os.listdir(exported.parent) if name.startswith(".export")]  # no staging left
    step, metadata, params = load_checkpoint(workdir, "best")
    decode_config, decode_params = decoding_variant(metadata.model_config(), params)
    config = json.loads((exported / "config.json").read_text())
    assert config["format"] == "jaxformer-export" and config["format_version"] == 1
    assert config["model"] == decode_config.to_dict()
    assert config["decoding"] == {
        "method": "beam",
        "beam_size": 3,
        "alpha": 0.6,
        "length_penalty": "gnmt",
        "max_extra_length": 8,
        "stop": "current_length",
        "temperature": 1.0,
        "top_k": 0,
        "renormalize_after_bans": False,
    }
    assert config["special_tokens"] == {"pad": 0, "eos": 1, "unk": 2, "bos": 3}
    assert config["serving"] == {"batch_size": 4, "length_bucket": 16, "max_source_tokens": 32, "max_source_length": 32}
    assert config["checkpoint"] == {
        "workdir": str(workdir.resolve()),
        "which": "best",
        "step": 1,
        "bleu": 12.5,
        "averaged_steps": None,
    }
    assert config["platforms"] == ["cpu", "cuda", "tpu"] and config["platforms_failed"] == {}
    assert (exported / "serve.py").read_bytes() == pathlib.Path(standalone.__file__).read_bytes()
    assert (exported / "sentence_batches.py").read_bytes() == pathlib.Path(sentence_batches.__file__).read_bytes()
    assert (exported / "argument_parser.py").read_bytes() == pathlib.Path(argument_parser.__file__).read_bytes()
    helpers = (export_files, export_program, serve_streams, exported_translator, text_lines, unmarked_wide_text)
    for helper in (pathlib.Path(module.__file__) for module in helpers):
        assert (exported / helper.name).read_bytes() == helper.read_bytes()
    digest = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    assert config["files"]["loader"] == {
        "name": "serve.py",
        "sha256": digest(exported / "serve.py"),
        "imports": [
            {"name": "unmarked_wide_text.py", "sha256": digest(exported / "unmarked_wide_text.py")},
            {"name": "text_lines.py", "sha256": digest(exported / "text_lines.py")},
            {"name": "sentence_batches.py", "sha256": digest(exported / "sentence_batches.py")},
            {"name": "argument_parser.py", "sha256": digest(exported / "argument_parser.py")},
            {"name": "export_files.py", "sha256": digest(exported / "export_files.py")},
            {"name": "export_program.py", "sha256": digest(exported / "export_program.py")},
            {"name": "serve_streams.py", "sha256": digest(exported / "serve_streams.py")},
            {"name": "exported_translator.py", "sha256": digest(exported / "exported_translator.py")},
        ],
    }
    assert (exported / "tokenizer.model").read_bytes() == metadata.tokenizer
    stored = read_safetensors(exported / "params.safetensors")
    expected = flatten(decode_params)
    assert sorted(stored) == sorted(expected) and "decoder/layer_1/feed_forward/wi_kernel" in stored
    for name, array in expected.items():
        assert stored[name].dtype == array.dtype and np.array_equal(stored[name], array), name
    program = jax.export.deserialize(bytearray((exported / "beam_search.jaxexport").read_bytes()))
    assert program.platforms == ("cpu", "cuda", "tpu")
    assert str(program.in_avals[-1]) == "int32[B,S]"  # symbolic batch and source length
    assert [str(aval) for aval in program.out_avals] == ["int32[B,3,S + 8]", "float32[B,3]"]


def test_serve_py_without_jaxformer_equals_the_translator(exported, translator, sentences, tmp_path):
    rng = np.random.default_rng(0)
    source = rng.integers(4, translator.config.vocab_size, (3, 21)).astype(np.int32)  # not a bucket, not a batch
    source[:, -1] = 1  # EOS
    source[0, 10:] = 0  # a shorter row: EOS then padding
    source[0, 10] = 1
    np.savez(tmp_path / "sources.npz", odd_shape=source)
    (tmp_path / "sentences.json").write_text(json.dumps(sentences))
    serving = serve_without_jaxformer(SERVE, exported, tmp_path)
    try:  # the references while it runs
        expected_nbest = translator.translate_nbest(sentences)
        expected_text = translator.translate(sentences)
        tokens, scores = jax.device_get(make_generate_fn(translator.config, SETTINGS)(translator.params, source))
        _, stderr = serving.communicate(timeout=300)
    finally:
        serving.kill()
    assert serving.returncode == 0, stderr[-3000:]
    served = json.loads((tmp_path / "results.json").read_text())
    assert served["loaded"] == []

    assert_same_hypotheses(served["nbest"], expected_nbest)
    assert served["nbest"][3] == [["", 0.0]] and len(served["nbest"][0]) == 3
    assert served["command"] == "".join(f"{text}\n" for text in expected_text)

    outputs = np.load(tmp_path / "outputs.npz")
    assert outputs["odd_shape_tokens"].shape == (3, 3, 21 + 8)
    np.testing.assert_array_equal(outputs["odd_shape_tokens"], tokens)
    np.testing.assert_allclose(outputs["odd_shape_scores"], scores, rtol=1e-6)  # symbolic shapes compile otherwise


# The public names serve.py defined itself before export_files.py and serve_streams.py took them
# (4c781c1), which code written against an earlier export may use: a bare serve.py must keep them.
NAMES_OF_EARLIER_EXPORTS = (
    *("FORMAT", "FORMAT_VERSION", "CONFIG_FILE", "LOADER_FILE", "LOADER_IMPORTS", "EXIT_NO_SPACE"),
    *("ExportError", "ExportedTranslator", "load", "read_export", "main"),
    *("SAFETENSORS_DTYPES", "Tokenizer", "read_safetensors", "parse_safetensors", "unflatten", "read_config"),
    *("read_verified", "check_loader_files", "read_tokenizer", "parse_program", "InputError", "stdin_lines"),
)

NAMES = """
import json, pathlib

directory, results = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
sys.path.insert(0, str(directory))
import serve

names = json.loads((results / "names.json").read_text())
found = {"missing": [name for name in names if not hasattr(serve, name)]}
if not found["missing"]:  # used as an earlier export's user used them
    found["config"] = serve.read_config(directory)
    found["tokenizer"] = isinstance(serve.load(directory).tokenizer, serve.Tokenizer)
    try:
        serve.stdin_lines(b"A man.\\n\\xff\\n")
    except serve.InputError as error:
        found["refused"] = str(error)
print(json.dumps(found))
"""


def test_serve_py_without_jaxformer_keeps_the_names_of_earlier_exports(exported, tmp_path):
    (tmp_path / "names.json").write_text(json.dumps(NAMES_OF_EARLIER_EXPORTS))
    stdout, stderr = serve_without_jaxformer(NAMES, exported, tmp_path).communicate(timeout=120)
    assert stdout, stderr[-3000:]
    found = json.loads(stdout)
    assert found["missing"] == []
    assert found["config"] == json.loads((exported / "config.json").read_text())
    assert found["tokenizer"] is True
    assert found["refused"].startswith("<stdin>: line 2 is not valid UTF-8")
    assert [name for name in NAMES_OF_EARLIER_EXPORTS if not hasattr(standalone, name)] == []  # and in the package


def test_translator_from_export_equals_the_translator(exported, translator, sentences, capsys):
    served = Translator.from_export(exported)
    assert served.batch_size == 4 and served.max_source_length == 32
    served_nbest = served.translate_nbest(sentences, progress=True)
    progress = capsys.readouterr().err  # before the Translator below logs its own warnings
    assert_same_hypotheses(served_nbest, translator.translate_nbest(sentences))
    assert served.translate(iter(sentences)) == [nbest[0][0] for nbest in served_nbest]  # read once, up front
    assert re.search(r"translate: (\d+)/\1\n", progress)  # every piece, counted on stderr
    # An empty line encodes to EOS alone, no sentence (translate_ids refuses it; translate gives it "").
    pieces = [ids for ids in map(translator.tokenizer.encode, sentences) if 1 < len(ids) <= 32][::-1]
    assert_same_hypotheses(served.translate_sequences(pieces), translator.translate_ids(pieces))
    # A padded [B, S] array's rows, as translate_ids takes them: the padding after each EOS dropped by both.
    rows = np.zeros((len(pieces), 32), np.int32)
    for row, ids in enumerate(pieces):
        rows[row, : len(ids)] = ids
    assert_same_hypotheses(served.translate_sequences(rows), served.translate_sequences(pieces))
    assert_same_hypotheses(served.translate_sequences(rows), translator.translate_ids(rows))
    with pytest.raises(ValueError, match="exceeds the 32 tokens"):
        served.translate_ids(np.append(np.full((1, 32), 5, np.int32), [[1]], axis=1))  # one sentence, ending in EOS


def test_an_export_is_never_overwritten_by_accident(workdir, tmp_path, capsys):
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "mine.txt").write_text("keep me")
    for flags, message in (
        ([], "holds something other than a jaxformer export"),  # not "pass --overwrite", which refuses it too
        (["--overwrite"], "holds something other than a jaxformer export"),
    ):
        assert export.main(["--workdir", str(workdir), "--output", str(stranger), *flags]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert os.listdir(stranger) == ["mine.txt"]

    file_output = tmp_path / "a-file"
    file_output.write_text("x")
    assert export.main(["--workdir", str(workdir), "--output", str(file_output)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_overwrite_replaces_an_export_whole_or_not_at_all(
    exported, workdir, tmp_path, monkeypatch, capsys, symbolic_shapes_unchecked
):
    output = tmp_path / "served"
    shutil.copytree(exported, output)
    before = {name: (output / name).read_bytes() for name in os.listdir(output)}
    flags = ["--workdir", str(workdir), "--checkpoint", "best", "--output", str(output), "--overwrite"]
    flags += ["--platforms", "tpu", *FLAGS]

    def crash(*args):
        raise RuntimeError("disk full (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(exporter, "write_program", crash)
        with pytest.raises(RuntimeError, match="simulated"):
            export.main(flags)
    assert {name: (output / name).read_bytes() for name in os.listdir(output)} == before  # the old export, intact
    assert os.listdir(tmp_path) == ["served"]  # no staging directory left behind

    assert export.main(flags) == 0  # for TPU only, from this CPU machine
    assert "for tpu" in capsys.readouterr().out
    assert json.loads((output / "config.json").read_text())["platforms"] == ["tpu"]
    assert sorted(os.listdir(tmp_path)) == ["served"]
    assert (output / "params.safetensors").read_bytes() == before["params.safetensors"]
    with pytest.raises(ExportError, match="beam_search.jaxexport was exported for tpu, but JAX runs on cpu here"):
        load_export(output)
    # Refused once the program is read, before the parameters: they were read and each byte hashed first.
    (output / "params.safetensors").write_bytes(b"not read")
    with pytest.raises(ExportError, match="beam_search.jaxexport was exported for tpu, but JAX runs on cpu here"):
        load_export(output)


def test_bad_flags_are_one_line(capsys):
    for flags, message in (
        (["--platforms", "gpu"], "argument --platforms: must be a comma-separated list of cpu, cuda, rocm, tpu"),
        (["--beam_size", "0"], "argument --beam_size"),
    ):
        with pytest.raises(SystemExit) as stop:
            export.main(["--workdir", "w", "--output", "o", *flags])
        assert stop.value.code == 2 and message in capsys.readouterr().err
    assert export.main(["--workdir", "/nonexistent/run", "--output", "o"]) == 2
    assert "--workdir /nonexistent/run: no such directory" in capsys.readouterr().err

    # closed without an error: what it held was let go, as the interpreter's last flush must let it go


def test_a_language_model_is_refused_before_its_parameters_are_read(workdir, tmp_path, capsys, monkeypatch):
    from jaxformer.model.decoder_only import DecoderOnly

    _, metadata, _ = load_checkpoint(workdir, params=False)
    config = metadata.model_config().replace(architecture="decoder_only")
    params = DecoderOnly(config).init(jax.random.key(0), np.ones((1, 4), np.int32))["params"]
    language_model = tmp_path / "lm"
    checkpointer = Checkpointer(RunDirectory(language_model).checkpoints, keep=None)
    checkpointer.save_params(1, params, metadata.replace(model=config.to_dict(), step=1))
    checkpointer.close()

    monkeypatch.setattr(Checkpointer, "_restore_params", lambda *args: pytest.fail("the parameters were read"))
    assert export.main(["--workdir", str(language_model), "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: {language_model} holds a decoder_only model; an export holds a translator's search "
        "and needs an encoder_decoder one (continue text with it through jaxformer-generate / LanguageModel)\n"
    )
    assert not (tmp_path / "out").exists()
