"""The damaged MarianMT directories jaxformer-convert --from_hf refuses in one line naming the file,
before any expensive work and writing nothing, and the earlier or other forms of one it reads
(test_marian_checks.py has the rest of the conversion's checks)."""

import json
import re
import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from jaxformer.commands import convert  # noqa: E402
from jaxformer.errors import EXIT_USER_ERROR  # noqa: E402
from jaxformer.export.safetensors import read_safetensors, write_safetensors  # noqa: E402
from jaxformer.interop import marian_files  # noqa: E402

# With test_marian_checks.py: one worker builds the untied model directory, once.
pytestmark = pytest.mark.xdist_group("interop-checks")


@pytest.fixture(scope="module")
def untied(untied_marian):
    return untied_marian


def _edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _without(path, key):
    config = json.loads(path.read_text())
    del config[key]
    path.write_text(json.dumps(config))


def _pad_and_another_banned(directory):
    pad = json.loads((directory / "config.json").read_text())["pad_token_id"]
    _edit_json(directory / "generation_config.json", bad_words_ids=[[pad], [5]])


def _text_piece_as_decoder_start(directory):
    """Decoding from id 5, an ordinary piece that MarianTokenizer gives for text (both files name it)."""
    _edit_json(directory / "config.json", decoder_start_token_id=5)
    _edit_json(directory / "generation_config.json", decoder_start_token_id=5)


def _config_setting_without_generation_config(directory):
    (directory / "generation_config.json").unlink()
    _edit_json(directory / "config.json", no_repeat_ngram_size=3)


def _unknown_tensor(directory):
    weights = read_safetensors(directory / "model.safetensors")
    weights["model.encoder.layernorm_embedding.weight"] = np.ones(32, np.float32)
    write_safetensors(directory / "model.safetensors", weights)


def _truncated_weights(directory):
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[: len(data) // 2])


def _damaged_torch_weights(directory):
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(b"not a torch file")


# name: (the damage, the file the message names, what it says, whether the weights get read)
DAMAGES = {
    "source.spm": (lambda d: (d / "source.spm").write_bytes(b"garbage"), "source.spm", "is not a sentencepiece model"),
    "empty target.spm": (lambda d: (d / "target.spm").write_bytes(b""), "target.spm", "is not a sentencepiece model"),
    "no d_model": (lambda d: _without(d / "config.json", "d_model"), "config.json", "has no 'd_model'"),
    "config.json a list": (lambda d: (d / "config.json").write_text("[]"), "config.json", "not an object"),
    "eos ids": (
        lambda d: _edit_json(d / "config.json", eos_token_id=[0, 5]),
        "config.json",
        ": eos_token_id=[0, 5] names several end tokens",
    ),
    "no pad_token_id": (  # it was this model's last id, where transformers cannot load the model
        lambda d: _without(d / "config.json", "pad_token_id"),
        "config.json",
        " has no pad_token_id, and MarianConfig's default 58100, which transformers takes, is not an id below ",
    ),
    "pad is eos": (
        lambda d: _edit_json(d / "config.json", pad_token_id=0),
        "config.json",
        ": pad_token_id and eos_token_id are both 0",
    ),
    "generation eos ids": (
        lambda d: _edit_json(d / "generation_config.json", eos_token_id=[0, 5]),
        "generation_config.json",
        ": eos_token_id=[0, 5] names several end tokens",
    ),
    "a token banned besides pad": (
        _pad_and_another_banned,
        "generation_config.json",
        ", [5]] changes what transformers generates",
    ),
    "forced_bos_token_id": (
        lambda d: _edit_json(d / "generation_config.json", forced_bos_token_id=5),
        "generation_config.json",
        ": forced_bos_token_id=5 changes what transformers generates",
    ),
    "forced_eos_token_id not eos": (
        lambda d: _edit_json(d / "generation_config.json", forced_eos_token_id=5),
        "generation_config.json",
        ": forced_eos_token_id=5 changes what transformers generates",
    ),
    "repetition_penalty": (
        lambda d: _edit_json(d / "generation_config.json", repetition_penalty=1.2),
        "generation_config.json",
        ": repetition_penalty=1.2 changes what transformers generates",
    ),
    "suppress_tokens": (
        lambda d: _edit_json(d / "generation_config.json", suppress_tokens=[5]),
        "generation_config.json",
        ": suppress_tokens=[5] changes what transformers generates",
    ),
    "watermarking_config": (  # the audit's: it changed transformers' greedy output on every sentence tried
        lambda d: _edit_json(d / "generation_config.json", watermarking_config={"bias": 2.0, "context_width": 1}),
        "generation_config.json",
        ": watermarking_config={'bias': 2.0, 'context_width': 1} changes what transformers generates",
    ),
    "separate_vocabs without target_vocab.json": (  # MarianTokenizer fails on it
        lambda d: _edit_json(d / "tokenizer_config.json", separate_vocabs=True),
        "tokenizer_config.json",
        ": separate_vocabs=true declares separate Marian vocabularies, but ",
    ),
    "source_lang a number": (  # the run's data.source_language: ml_collections' TypeError after the conversion
        lambda d: _edit_json(d / "tokenizer_config.json", source_lang=5),
        "tokenizer_config.json",
        ": source_lang=5 is not a language code (a JSON string)",
    ),
    "early_stopping a string": (  # transformers: true, false or "never"
        lambda d: _edit_json(d / "generation_config.json", num_beams=4, early_stopping="yes"),
        "generation_config.json",
        ': early_stopping="yes" is not true, false or "never"',
    ),
    "generation decoder start": (
        lambda d: _edit_json(d / "generation_config.json", decoder_start_token_id=5),
        "generation_config.json",
        ": decoder_start_token_id=5 differs from",
    ),
    "config.json's settings without generation_config.json": (
        _config_setting_without_generation_config,
        "config.json",
        "/config.json: no_repeat_ngram_size=3 changes what transformers generates",
    ),
    # transformers refuses these; Python's truth value read the string "false" as true
    "scale_embedding a string": (
        lambda d: _edit_json(d / "config.json", scale_embedding="false"),
        "config.json",
        ': scale_embedding="false" is not a JSON boolean (true or false)',
    ),
    "tie_word_embeddings a number": (
        lambda d: _edit_json(d / "config.json", tie_word_embeddings=0),
        "config.json",
        ": tie_word_embeddings=0 is not a JSON boolean (true or false)",
    ),
    "renormalize_logits a string": (  # transformers renormalizes for true alone
        lambda d: _edit_json(d / "generation_config.json", renormalize_logits="true"),
        "generation_config.json",
        ': renormalize_logits="true" is not a JSON boolean (true or false)',
    ),
    "share_encoder_decoder_embeddings null": (
        lambda d: _edit_json(d / "config.json", share_encoder_decoder_embeddings=None),
        "config.json",
        ": share_encoder_decoder_embeddings=null is not a JSON boolean (true or false)",
    ),
    # transformers refuses these too (its config's field types)
    "dropout null": (
        lambda d: _edit_json(d / "config.json", dropout=None),
        "config.json",
        ": dropout=null is not a number",
    ),
    "attention_dropout a string": (
        lambda d: _edit_json(d / "config.json", attention_dropout="0.1"),
        "config.json",
        ': attention_dropout="0.1" is not a number',
    ),
    "activation_function a list": (
        lambda d: _edit_json(d / "config.json", activation_function=["swish"]),
        "config.json",
        ": activation_function ['swish']; supported: ",
    ),
    "ffn width": (  # transformers: a size mismatch
        lambda d: _edit_json(d / "config.json", encoder_ffn_dim=48, decoder_ffn_dim=48),
        "model.safetensors",
        ".fc1.bias has shape (64,), but ",
    ),
    "encoder and decoder ffn widths": (
        lambda d: _edit_json(d / "config.json", encoder_ffn_dim=64, decoder_ffn_dim=96),
        "config.json",
        ": encoder_ffn_dim=64 differs from decoder_ffn_dim=96; jaxformer's model has one value for both stacks, "
        "so it cannot convert this model",
    ),
    "encoder and decoder heads": (
        lambda d: _edit_json(d / "config.json", encoder_attention_heads=4, decoder_attention_heads=2),
        "config.json",
        ": encoder_attention_heads=4 differs from decoder_attention_heads=2; jaxformer's model has one value",
    ),
    # named as config.json names them, not as jaxformer's TransformerConfig fields (dropout_rate, num_heads)
    "dropout out of range": (
        lambda d: _edit_json(d / "config.json", dropout=1.5),
        "config.json",
        ": dropout=1.5: must lie in [0, 1)",
    ),
    "activation_dropout out of range": (
        lambda d: _edit_json(d / "config.json", activation_dropout=-0.1),
        "config.json",
        ": activation_dropout=-0.1: must lie in [0, 1)",
    ),
    "heads not dividing d_model": (  # transformers' attention refuses it too
        lambda d: _edit_json(d / "config.json", encoder_attention_heads=5, decoder_attention_heads=5),
        "config.json",
        ": d_model=32 is not divisible by encoder_attention_heads=5",
    ),
    "a decoder start token that is text": (  # jaxformer's tokenizers never produce BOS: other ids for the same text
        _text_piece_as_decoder_start,
        "config.json",
        ": decoder_start_token_id=5 is ",
    ),
    "fewer layers": (  # transformers: unexpected weights, dropped
        lambda d: _edit_json(d / "config.json", encoder_layers=1),
        "model.safetensors",
        "holds model.encoder.layers.1.",
    ),
    "a tensor of no Marian parameter": (
        _unknown_tensor,
        "model.safetensors",
        "holds model.encoder.layernorm_embedding.weight, which a MarianMTModel of ",
    ),
    "truncated model.safetensors": (_truncated_weights, "model.safetensors", "is not a readable safetensors file"),
    "pytorch_model.bin": (_damaged_torch_weights, "pytorch_model.bin", "is not a readable torch state dict"),
}
# transformers < 4's keys for another network, which transformers 5 ignores
for key, value, network in (
    ("normalize_before", True, "pre-norm layers"),
    ("add_final_layer_norm", True, "a LayerNorm after each stack"),
    ("normalize_embedding", True, "a LayerNorm on the embeddings"),
    ("static_position_embeddings", False, "learned positions"),
):
    DAMAGES[f"{key}={value}"] = (
        lambda d, key=key, value=value: _edit_json(d / "config.json", **{key: value}),
        "config.json",
        f": {key}={json.dumps(value)} declares {network}, which transformers before 4 built",
    )


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_directory_is_refused_in_one_line_naming_the_file(untied, damage, tmp_path, capsys, monkeypatch):
    directory = shutil.copytree(untied[0], tmp_path / "hf")
    spoil, file, problem = DAMAGES[damage]
    spoil(directory)
    if file not in ("model.safetensors", "pytorch_model.bin"):  # found before the weights are read

        def read_weights(_):
            raise AssertionError("the weights were read")

        monkeypatch.setattr(marian_files, "_read_weights", read_weights)
    output = tmp_path / "run"
    assert convert.main(["--from_hf", str(directory), "--output", str(output)]) == EXIT_USER_ERROR
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    assert file in error and problem in error, error
    assert not output.exists()


def test_the_earlier_keys_of_an_opus_mt_config_are_accepted(untied, tmp_path):
    directory = shutil.copytree(untied[0], tmp_path / "hf")
    # Helsinki-NLP/opus-mt-en-de's, which transformers 5 ignores: they declare MarianMT's network
    earlier = dict(normalize_before=False, add_final_layer_norm=False, normalize_embedding=False)
    _edit_json(directory / "config.json", static_position_embeddings=True, add_bias_logits=False, **earlier)
    marian_files.read_marian_directory(directory)


@pytest.mark.parametrize("separate_vocabs", [None, False, 0])
def test_a_tokenizer_config_without_separate_vocabularies_is_read(untied, tmp_path, separate_vocabs):
    """null, false or 0: one vocabulary, as MarianTokenizer reads them (only a true value needs a target_vocab.json)."""
    directory = shutil.copytree(untied[0], tmp_path / "hf")
    _edit_json(directory / "tokenizer_config.json", separate_vocabs=separate_vocabs)
    marian_files.read_marian_directory(directory)


def test_the_weights_are_held_to_config_json_naming_both_shapes_and_keys(untied, tmp_path):
    directory = shutil.copytree(untied[0], tmp_path / "hf")
    _edit_json(directory / "config.json", encoder_ffn_dim=48, decoder_ffn_dim=48)
    with pytest.raises(marian_files.ConversionError) as error:
        marian_files.read_marian_directory(directory)
    ffn = (
        r"/model\.safetensors: model\.(encoder|decoder)\.layers\.0\.fc1\.bias has shape \(64,\), "
        r"but .*/config\.json's \1_ffn_dim=48, d_model=32 give \(48,\)$"
    )
    assert re.search(ffn, str(error.value)), error.value
    _edit_json(directory / "config.json", encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1)
    with pytest.raises(marian_files.ConversionError, match=r"a layer beyond .*config\.json's encoder_layers=1$"):
        marian_files.read_marian_directory(directory)


def test_a_transformers_4_state_dict_with_its_sinusoids_is_read(untied, tmp_path):
    directory = shutil.copytree(untied[0], tmp_path / "hf")
    (directory / "model.safetensors").unlink()
    state = untied[1].state_dict()  # as transformers 4 saved it: the sinusoids too
    assert state["model.encoder.embed_positions.weight"].shape == (128, 32)
    torch.save(state, directory / "pytorch_model.bin")
    assert set(marian_files.read_marian_directory(directory).weights) == set(state)
    from jaxformer.interop.marian import convert_marian

    convert_marian(marian_files.read_marian_directory(directory))  # the sinusoids computed: accepted
    # Learned or edited positions, which transformers 5 loads and uses, were dropped without a word.
    edited = dict(state)
    edited["model.encoder.embed_positions.weight"] = edited["model.encoder.embed_positions.weight"] + 0.1
    torch.save(edited, directory / "pytorch_model.bin")
    with pytest.raises(marian_files.ConversionError) as raised:
        convert_marian(marian_files.read_marian_directory(directory))
    assert str(raised.value) == (
        "model.encoder.embed_positions.weight is not the sinusoids transformers computes (they differ by up to 0.1; "
        "not a float16 or bfloat16 copy of them either): jaxformer computes its positions, so learned or edited ones "
        "cannot be imported"
    )
    # An edit within a half-precision copy's rounding (5e-3) was imported as the computed sinusoids,
    # and transformers' logits with the file's table lay 0.03 from the import's (measured).
    sinusoids = state["model.encoder.embed_positions.weight"]
    nudged = sinusoids + 4e-3 * torch.sign(torch.randn(sinusoids.shape, generator=torch.Generator().manual_seed(0)))
    torch.save({**state, "model.encoder.embed_positions.weight": nudged}, directory / "pytorch_model.bin")
    with pytest.raises(marian_files.ConversionError, match=r"^model\.encoder\.embed_positions\.weight is not the "):
        convert_marian(marian_files.read_marian_directory(directory))
    for copy in (torch.float16, torch.bfloat16):  # a half-precision save's copies are its sinusoids still
        halved = {name: value.to(copy) for name, value in state.items()}
        torch.save(halved, directory / "pytorch_model.bin")
        convert_marian(marian_files.read_marian_directory(directory))
    state["model.decoder.embed_positions.weight"] = state["model.decoder.embed_positions.weight"][:64]
    torch.save(state, directory / "pytorch_model.bin")
    with pytest.raises(marian_files.ConversionError, match=r"max_position_embeddings=128, d_model=32 give"):
        marian_files.read_marian_directory(directory)


def test_weights_it_cannot_read_are_named(untied, tmp_path, monkeypatch):
    directory = shutil.copytree(untied[0], tmp_path / "hf")
    (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
    (directory / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(marian_files.ConversionError, match=r"model\.safetensors\.index\.json: the weights are sharded"):
        marian_files.read_marian_directory(directory)
    torch.save(untied[1].state_dict(), directory / "pytorch_model.bin")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # torch not installed
    with pytest.raises(marian_files.ConversionError) as raised:
        marian_files.read_marian_directory(directory)
    assert str(raised.value).endswith(
        "pytorch_model.bin: reading a torch checkpoint needs torch: pip install "
        "'jaxformer[interop]' (a model.safetensors is read without it)"
    )
    monkeypatch.undo()
    _edit_json(directory / "config.json", decoder_vocab_size=200)
    with pytest.raises(marian_files.ConversionError, match=r"decoder_vocab_size=200 differs from vocab_size="):
        marian_files.read_marian_directory(directory)


def test_one_eos_id_in_a_list_is_that_id():
    config = {"vocab_size": 8, "eos_token_id": [0, 0], "pad_token_id": 7}
    assert marian_files.marian_token_ids(config, {}, "config.json") == (7, 0, 7)


def test_a_config_without_pad_and_start_ids_has_those_transformers_reads():
    """They were the model's last id, where transformers takes MarianConfig's defaults."""
    from transformers import MarianConfig

    config = {"vocab_size": 60_000, "eos_token_id": 0}
    read = MarianConfig(**config)
    assert marian_files.marian_token_ids(config, {}, "config.json") == (
        read.pad_token_id,
        read.eos_token_id,
        read.decoder_start_token_id,
    )
