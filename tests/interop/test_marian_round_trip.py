"""MarianMT round trips (jaxformer/interop/marian.py): a jaxformer run exported and imported again
is the same model (its vocabulary, ids, pieces, parameters and translations), and an OPUS-MT-style
model (decoding from its pad token, imported with a copied BOS row) imported, exported and
imported again is what the first import gave. Both once grew the vocabulary by a row."""

import json

import numpy as np
import pytest

from tests.conftest import make_workdir

pytest.importorskip("transformers")
pytest.importorskip("torch")

from jaxformer.decoding.generate import DecodeSettings  # noqa: E402
from jaxformer.decoding.translator import Translator  # noqa: E402
from jaxformer.export.safetensors import flatten, read_safetensors, write_safetensors  # noqa: E402
from jaxformer.interop.marian import import_marian  # noqa: E402
from jaxformer.interop.marian_export import export_marian, logical_axis_names, permute_axis  # noqa: E402
from jaxformer.interop.marian_layout import ConversionError, marian_to_jaxformer_ids, vocabulary_order  # noqa: E402
from jaxformer.model.position import halves_order  # noqa: E402
from jaxformer.run.loading import load_checkpoint  # noqa: E402
from jaxformer.tokens import EOS_ID  # noqa: E402
from tests.interop.marian_models import MAX_EXTRA, sentences, write_marian  # noqa: E402

pytestmark = pytest.mark.xdist_group("interop-round-trip")


def _pieces(tokenizer):
    return tokenizer.pieces(range(tokenizer.vocab_size))


def _flat(workdir):
    _, metadata, params = load_checkpoint(workdir)
    return metadata, {path: np.asarray(value) for path, value in flatten(params).items()}


def _translations(workdir, texts):
    settings = DecodeSettings(method="greedy", max_extra_length=MAX_EXTRA)
    return Translator.from_workdir(workdir, settings=settings).translate(texts)


def test_a_run_exported_and_imported_again_is_the_same_model(tmp_path):
    workdir, _, tokenizer = make_workdir(tmp_path / "run")
    directory = export_marian(workdir, tmp_path / "hf")
    converted = import_marian(directory, tmp_path / "again")

    assert converted.config.vocab_size == converted.config.encoder_vocab_size == tokenizer.vocab_size
    np.testing.assert_array_equal(converted.order, np.arange(tokenizer.vocab_size))  # the same ids
    assert _pieces(converted.source_tokenizer) == _pieces(converted.target_tokenizer) == _pieces(tokenizer)
    texts = sentences(4)
    for text in texts:
        np.testing.assert_array_equal(converted.source_tokenizer.encode(text), tokenizer.encode(text))

    original, ours = _flat(workdir)
    metadata, theirs = _flat(tmp_path / "again")
    assert metadata.config["tokenizer"]["vocab_size"] == tokenizer.vocab_size
    # The import is in Marian's halves layout: the model width permuted back, every value is the run's.
    config = metadata.model_config()
    back = np.argsort(halves_order(config.d_model))
    theirs = permute_axis(theirs, logical_axis_names(config), "embed", back)
    shared = ours.pop("shared_embedding/embedding")
    np.testing.assert_array_equal(theirs.pop("source_embedding/embedding"), shared)
    np.testing.assert_array_equal(theirs.pop("target_embedding/embedding"), shared)
    np.testing.assert_array_equal(theirs.pop("decoder/logits_bias"), np.zeros(tokenizer.vocab_size))  # the run has none
    assert sorted(theirs) == sorted(ours)
    for path, value in ours.items():
        np.testing.assert_array_equal(theirs[path], value, err_msg=path)
    assert _translations(tmp_path / "again", texts) == _translations(workdir, texts)


def test_an_opus_model_imported_exported_and_imported_again_is_unchanged(tmp_path):
    marian = tmp_path / "opus"
    model = write_marian(marian)  # decoder_start_token_id = pad_token_id, as OPUS-MT's
    first = import_marian(marian, tmp_path / "first")
    assert first.config.vocab_size == model.config.vocab_size + 1  # the copied BOS row
    second = import_marian(export_marian(tmp_path / "first", tmp_path / "exported"), tmp_path / "second")

    assert second.config == first.config
    np.testing.assert_array_equal(second.order, np.arange(first.config.vocab_size))
    assert second.source_tokenizer.model_proto == first.source_tokenizer.model_proto
    assert second.target_tokenizer.model_proto == first.target_tokenizer.model_proto
    (first_metadata, first_params), (metadata, params) = _flat(tmp_path / "first"), _flat(tmp_path / "second")
    assert metadata.model == first_metadata.model and metadata.config == first_metadata.config
    assert sorted(params) == sorted(first_params)
    for path, value in first_params.items():  # BOS's row and its bias (the pad's minus the offset) included
        np.testing.assert_array_equal(params[path], value, err_msg=path)


def test_a_models_positions_bound_its_translations_and_come_back_in_its_export(tmp_path):
    """transformers refuses an input past max_position_embeddings (IndexError in embed_positions);
    the import once dropped it, translated sources and outputs with positions the model never had,
    and --to_hf wrote 512 instead."""
    marian, positions = tmp_path / "hf", 12
    write_marian(marian, max_position_embeddings=positions)
    weights = read_safetensors(marian / "model.safetensors")
    weights["final_logits_bias"][0, 0] = -1e4  # Marian's eos: each output runs to its length limit
    write_safetensors(marian / "model.safetensors", weights)
    converted = import_marian(marian, tmp_path / "run")
    assert converted.config.max_positions == positions

    translator = Translator.from_workdir(
        tmp_path / "run", settings=DecodeSettings(method="greedy", max_extra_length=50)
    )
    assert translator.max_source_tokens == positions  # longer sources are translated in pieces
    text = " ".join(sentences(3))
    assert len(translator.tokenizer.encode(text)) > positions
    short = translator.tokenizer.encode(sentences(1)[0])[:3]
    for source in (
        np.append(short[:2], EOS_ID),
        translator.tokenizer.encode(text)[: positions - 1].tolist() + [EOS_ID],
    ):
        (hypotheses,) = translator.translate_ids([np.asarray(source, np.int32)])
        output = hypotheses[0][0]
        assert int(np.argmax(output == EOS_ID)) + 1 == min(len(source) + 50, positions)

    exported = export_marian(tmp_path / "run", tmp_path / "exported")
    assert json.loads((exported / "config.json").read_text())["max_position_embeddings"] == positions
    with pytest.raises(ConversionError, match=f"^max_positions=64 is more than the {positions} positions"):
        export_marian(tmp_path / "run", tmp_path / "wider", max_positions=64)


def test_the_decoder_start_is_bos_itself_unless_it_is_pad_eos_or_unk():
    # Marian ids: pad 5, eos 0, unk 1; OPUS-MT starts from pad, a jaxformer export from a token of its own.
    copied = vocabulary_order(6, 5, 0, 1, 5)
    assert copied.tolist() == [5, 0, 1, 5, 2, 3, 4]  # BOS a copy of pad's row
    assert marian_to_jaxformer_ids(copied).tolist() == [1, 2, 4, 5, 6, 0]  # pad keeps its own id 0
    own = vocabulary_order(6, 5, 0, 1, 3)
    assert own.tolist() == [5, 0, 1, 3, 2, 4]  # no extra row
    assert marian_to_jaxformer_ids(own).tolist() == [1, 2, 4, 3, 5, 0]
