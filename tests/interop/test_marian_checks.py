"""MarianMT interop beyond the common model (test_marian.py): untied embeddings imported against
transformers, scan_layers and bf16 runs exported, and the generation settings, outputs and
misplaced flags jaxformer-convert refuses in one line before any expensive work, writing nothing
(the damaged directories it refuses: test_marian_directory_checks.py)."""

import logging
import re

import numpy as np
import pytest

from tests.conftest import make_workdir

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import MarianMTModel, MarianTokenizer  # noqa: E402

from jaxformer.commands import convert  # noqa: E402
from jaxformer.decoding.generate import DecodeSettings  # noqa: E402
from jaxformer.decoding.translator import Translator  # noqa: E402
from jaxformer.errors import EXIT_USER_ERROR  # noqa: E402
from jaxformer.export.safetensors import read_safetensors  # noqa: E402
from jaxformer.interop import marian_files, marian_generation  # noqa: E402
from jaxformer.interop.marian_export import export_marian  # noqa: E402
from jaxformer.interop.marian_layout import marian_to_jaxformer_ids  # noqa: E402
from jaxformer.model.transformer import Transformer, stack_layers  # noqa: E402
from jaxformer.run.loading import load_checkpoint  # noqa: E402
from tests.interop.marian_models import (  # noqa: E402
    MAX_EXTRA,
    hf_generate,
    rewritten_run,
    sentences,
    teacher_forced_logits,
    until_eos,
)

# With test_marian_directory_checks.py: one worker builds the untied model directory (tests/conftest.py), once.
pytestmark = pytest.mark.xdist_group("interop-checks")

EMBEDDINGS = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


@pytest.fixture(scope="module")
def untied(untied_marian):
    return untied_marian


def test_untied_encoder_and_decoder_embeddings_are_imported_as_transformers_uses_them(untied):
    directory, model, workdir, converted = untied
    weights = read_safetensors(directory / "model.safetensors")
    for name in EMBEDDINGS:  # transformers 5 saves each; model.shared then computes nothing
        assert np.abs(weights[name] - weights["model.shared.weight"]).max() > 0.1, name
    assert not converted.config.share_embeddings and not converted.config.tie_output_embedding

    logits, expected = teacher_forced_logits(directory, model, workdir, converted.order)
    marian_ids = np.arange(converted.config.vocab_size) != 3  # BOS's column has no Marian counterpart
    assert np.abs(logits[:, marian_ids] - expected[:, marian_ids]).max() < 1e-4

    tokenizer = MarianTokenizer.from_pretrained(directory)
    translator = Translator.from_workdir(workdir, settings=DecodeSettings(method="greedy", max_extra_length=MAX_EXTRA))
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    sources = [tokenizer(text)["input_ids"] for text in sorted(sentences(20), key=len)[:4]]
    to_jaxformer = marian_to_jaxformer_ids(converted.order)
    results = translator.translate_ids([to_jaxformer[ids].astype(np.int32) for ids in sources])
    for ids, hypotheses in zip(sources, results, strict=True):
        expected_ids, _ = hf_generate(model, ids, len(ids) + MAX_EXTRA, 1, pad, pad, eos, [pad])
        assert [[int(converted.order[token]) for token in until_eos(hypotheses[0][0], 1)]] == expected_ids


# -- exporting runs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("run"))
    return workdir


def test_a_scan_layers_run_exports_with_its_outputs(run, tmp_path, caplog):
    workdir = rewritten_run(run, tmp_path / "scanned", stack_layers, scan_layers=True)
    with caplog.at_level(logging.WARNING):
        directory = export_marian(workdir, tmp_path / "hf")
    assert not [record for record in caplog.records if "bfloat16" in record.getMessage()]  # a float32 run

    model = MarianMTModel.from_pretrained(directory).eval()
    _, metadata, params = load_checkpoint(workdir)
    assert metadata.model_config().scan_layers and metadata.model_config().position_layout == "interleaved"
    tokenizer = metadata.load_tokenizer()
    source = np.asarray([tokenizer.encode(text) for text in sentences(1)])
    target = np.concatenate([[[3]], source[:, :-1]], axis=1)  # any tokens after BOS
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(source), decoder_input_ids=torch.from_numpy(target)).logits
    logits = Transformer(metadata.model_config()).apply({"params": params}, source, target, deterministic=True)
    assert np.abs(np.asarray(logits) - expected.numpy()).max() < 1e-4


def test_a_bf16_products_run_exports_with_a_warning_of_what_changes(run, tmp_path, caplog):
    workdir = rewritten_run(run, tmp_path / "bf16", matmul_dtype="bfloat16")
    with caplog.at_level(logging.WARNING):
        export_marian(workdir, tmp_path / "hf")
    warnings = [record.getMessage() for record in caplog.records if "bfloat16" in record.getMessage()]
    assert len(warnings) == 1 and "model.matmul_dtype=bfloat16" in warnings[0] and "1e-2" in warnings[0]


@pytest.mark.parametrize(
    ("model", "max_positions", "message"),
    [
        ({"normalization": "pre"}, None, "TransformerConfig.normalization='pre' has no MarianMT form"),
        ({"position_base": 500.0}, None, "TransformerConfig.position_base=500.0 has no MarianMT form"),
        ({"architecture": "decoder_only"}, None, "TransformerConfig.architecture='decoder_only' has no MarianMT form"),
        ({"max_positions": 16}, 32, "max_positions=32 is more than the 16 positions the run's model has"),
    ],
)
def test_a_run_marian_cannot_hold_is_refused_before_its_parameters_are_read(
    run, tmp_path, monkeypatch, model, max_positions, message
):
    """What the checkpoint's metadata says is refused from it: a large run's parameters were read
    (and checked against their checksums) first."""
    from jaxformer.run.checkpoint import Checkpointer

    workdir = rewritten_run(run, tmp_path / "run", **model)

    def parameters_read(*args):
        pytest.fail("the parameters were read")

    monkeypatch.setattr(Checkpointer, "_restore_params", parameters_read)
    with pytest.raises(marian_files.ConversionError, match=re.escape(message)):
        export_marian(workdir, tmp_path / "hf", max_positions=max_positions)
    assert not (tmp_path / "hf").exists()


# -- what jaxformer-convert refuses ----------------------------------------------------------


def test_generation_settings_that_decode_as_jaxformer_does_are_accepted():
    # Helsinki-NLP/opus-mt-en-de's generation_config.json, and the settings that change nothing.
    opus = {"bad_words_ids": [[58100]], "forced_eos_token_id": 0, "max_length": 512, "num_beams": 4}
    marian_generation.check_generation_settings(opus, 58100, 0, 58100, "generation_config.json")
    neutral = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 1, "suppress_tokens": [58100]}
    marian_generation.check_generation_settings(neutral, 58100, 0, 58100, "generation_config.json")
    started = {"bad_words_ids": [[0], [3]], "suppress_tokens": [3]}  # jaxformer's --to_hf: pad 0, start 3
    marian_generation.check_generation_settings(started, 0, 1, 3, "generation_config.json")
    with pytest.raises(marian_files.ConversionError, match=r"^g.json: bad_words_ids=\[\[0\]\] changes"):
        marian_generation.check_generation_settings({"bad_words_ids": [[0]]}, 58100, 0, 58100, "g.json")  # eos banned


# The keys of transformers' GenerationConfig that change no token greedy or beam search chooses
# (marian_generation's docstring says why), besides the ids marian_token_ids checks.
GENERATION_KEYS_THAT_CHANGE_NOTHING = {
    *("num_beams", "length_penalty", "early_stopping", "max_length", "max_new_tokens", "num_return_sequences"),
    *("do_sample", "temperature", "top_k", "top_p", "typical_p", "min_p", "top_h", "epsilon_cutoff", "eta_cutoff"),
    *("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "remove_invalid_values"),
    *("use_cache", "cache_implementation", "cache_config", "max_cache_len", "low_memory", "prefill_chunk_size"),
    *("compile_config", "disable_compile", "continuous_batching_config", "is_assistant", "use_mtp"),
    *("assistant_confidence_threshold", "assistant_early_exit", "assistant_lookbehind", "target_lookbehind"),
    *("num_assistant_tokens", "num_assistant_tokens_schedule", "prompt_lookup_num_tokens", "speculation_type"),
    *("max_matching_ngram_size", "output_attentions", "output_hidden_states", "output_logits", "output_scores"),
    *("return_dict_in_generate", "transformers_version", "_from_model_config"),
}


def test_every_setting_of_transformers_generate_is_refused_or_changes_no_token():
    from transformers import GenerationConfig

    keys = set(GenerationConfig().to_dict())
    unknown = keys - GENERATION_KEYS_THAT_CHANGE_NOTHING - set(marian_generation.GENERATION_SETTINGS)
    unknown -= set(marian_generation.CARRIED_SETTINGS)
    assert not unknown, f"transformers' GenerationConfig has keys neither refused nor known harmless: {unknown}"


@pytest.mark.parametrize(
    "key, value",
    [
        ("watermarking_config", {"greenlist_ratio": 0.25, "bias": 2.0}),
        ("force_words_ids", [[5]]),
        ("constraints", [{"token_ids": [5]}]),
        ("guidance_scale", 1.5),
        ("stop_strings", ["."]),
        ("penalty_alpha", 0.6),
        ("diversity_penalty", 0.5),
        ("dola_layers", "high"),
        ("token_healing", True),
        ("max_time", 10.0),
        ("assistant_ensemble_weight", 0.5),
    ],
)
def test_settings_of_searches_jaxformer_lacks_are_refused_and_their_neutral_values_accepted(key, value):
    with pytest.raises(marian_files.ConversionError, match=rf"^g.json: {key}=.* changes what transformers generates"):
        marian_generation.check_generation_settings({key: value}, 58100, 0, 58100, "g.json")
    neutral = {"guidance_scale": 1.0, "penalty_alpha": 0.0, "diversity_penalty": 0.0, "token_healing": False}
    marian_generation.check_generation_settings({key: neutral.get(key)}, 58100, 0, 58100, "g.json")


def test_renormalize_logits_is_carried_over_not_refused():
    """opus-mt-en-jap's generation_config.json sets it (the audit saw 9 of 40 four-best lists differ
    without it): the import's search renormalizes as transformers does (test_marian.py)."""
    for value, renormalizes in ((True, True), (False, False), (None, False)):
        marian_generation.check_generation_settings({"renormalize_logits": value}, 58100, 0, 58100, "g.json")
        assert marian_generation.renormalizes({"renormalize_logits": value}, "g.json") is renormalizes
    assert marian_generation.renormalizes({}, "g.json") is False
    for value, written in (("true", '"true"'), (1, "1")):  # transformers renormalizes for true alone
        with pytest.raises(marian_files.ConversionError) as raised:
            marian_generation.renormalizes({"renormalize_logits": value}, "g.json")
        assert str(raised.value) == f"g.json: renormalize_logits={written} is not a JSON boolean (true or false)"


def test_an_output_that_cannot_be_created_is_refused_before_anything_is_read(
    untied, run, tmp_path, capsys, monkeypatch
):
    from jaxformer.interop import marian
    from jaxformer.run import loading

    def read(*_):
        raise AssertionError("the input was read")

    monkeypatch.setattr(marian, "read_marian_directory", read)
    monkeypatch.setattr(loading, "load_checkpoint", read)
    (tmp_path / "afile").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "run")  # mkdir would not follow it: refused
    (tmp_path / "gone").symlink_to("nowhere")  # a folder above the output, relative
    outputs = {
        str(tmp_path / "afile" / "sub"): f"{tmp_path / 'afile'} is a file, not a folder",
        "/proc/jaxformer-output": "/proc takes no new entries (",
        str(tmp_path / "dangling"): f"is a link to {tmp_path / 'nowhere' / 'run'}, which does not exist",
        str(tmp_path / "gone" / "run"): f"{tmp_path / 'gone'} is a link to nowhere, which does not exist",
    }
    for direction, source in (("--from_hf", untied[0]), ("--to_hf", run)):
        for output, reason in outputs.items():
            assert convert.main([direction, str(source), "--output", output]) == EXIT_USER_ERROR
            error = capsys.readouterr().err
            assert error.startswith(f"error: --output {output}: cannot write it: {reason}"), error
            assert error.count("\n") == 1, error
    assert (tmp_path / "afile").read_text() == "" and not (tmp_path / "nowhere").exists()  # nothing through a link


def test_flags_of_the_other_direction_are_refused_even_at_their_default_values(tmp_path, capsys):
    for argv, message in (
        (["--from_hf", "hf", "--checkpoint", "latest"], "--checkpoint applies to --to_hf, not --from_hf"),
        (["--from_hf", "hf", "--max_positions", "512"], "--max_positions applies to --to_hf, not --from_hf"),
    ):
        assert convert.main([*argv, "--output", str(tmp_path / "out")]) == EXIT_USER_ERROR
        assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "out").exists()
