"""MarianMT's embedding forms both ways (jaxformer/interop/marian.py, marian_export.py): an imported
model fine-tuned until its encoder's and decoder's copies of Marian's embedding differ exports as
transformers' separate embed_tokens (share_encoder_decoder_embeddings=false; it was refused), and
such a model made with transformers imports as transformers computes it; an untied output layer
exports as lm_head (tie_word_embeddings=false; it was refused), so that a model imported untied
(scale_embedding=false, or its own lm_head) exports back to the first import bit for bit."""

import json
import logging
import shutil

import numpy as np
import pytest

from tests.conftest import make_workdir, read_raw

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import MarianMTModel, MarianTokenizer  # noqa: E402

from jaxformer.data.tokenizer import train_tokenizer  # noqa: E402
from jaxformer.export.safetensors import flatten, read_safetensors, write_safetensors  # noqa: E402
from jaxformer.interop.marian import ConversionError, import_marian  # noqa: E402
from jaxformer.interop.marian_export import export_marian  # noqa: E402
from jaxformer.interop.marian_layout import marian_to_jaxformer_ids  # noqa: E402
from jaxformer.run.checkpoint import Checkpointer  # noqa: E402
from jaxformer.run.directory import RunDirectory  # noqa: E402
from jaxformer.run.loading import load_checkpoint  # noqa: E402
from tests.interop.marian_models import (  # noqa: E402
    check_export_matches_run,
    rewritten_run,
    sentences,
    teacher_forced_logits,
    write_marian,
)

pytestmark = pytest.mark.xdist_group("interop-embeddings")  # the module's models are built once


@pytest.fixture(scope="module")
def opus(tmp_path_factory):
    """An OPUS-MT-style model (one shared embedding, decoding from pad) imported as a run."""
    directory = tmp_path_factory.mktemp("opus")
    write_marian(directory)
    workdir = tmp_path_factory.mktemp("opus-run") / "run"
    import_marian(directory, workdir)
    return workdir


def _flat(workdir):
    _, metadata, params = load_checkpoint(workdir)
    return metadata, {path: np.asarray(value) for path, value in flatten(params).items()}


def _assert_same_run(first, second):
    (first_metadata, first_params), (metadata, params) = _flat(first), _flat(second)
    assert metadata.model == first_metadata.model
    assert sorted(params) == sorted(first_params)
    for path, value in first_params.items():
        np.testing.assert_array_equal(params[path], value, err_msg=path)


def _trained_apart(params):
    """What fine-tuning does to an imported model's source and target copies of Marian's embedding."""
    generator = np.random.default_rng(0)
    changed = dict(params)
    for name in ("source_embedding", "target_embedding"):
        embedding = np.asarray(params[name]["embedding"])
        changed[name] = {"embedding": embedding + 0.05 * generator.standard_normal(embedding.shape, np.float32)}
    return changed


@pytest.mark.slow  # to the slow set (about 13 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_an_import_whose_embeddings_were_trained_apart_exports_and_reads_back(opus, tmp_path):
    workdir = rewritten_run(opus, tmp_path / "tuned", _trained_apart)
    directory = export_marian(workdir, tmp_path / "hf")
    config = json.loads((directory / "config.json").read_text())
    assert config["share_encoder_decoder_embeddings"] is False and config["tie_word_embeddings"] is True
    weights = read_safetensors(directory / "model.safetensors")
    assert "model.shared.weight" not in weights and "lm_head.weight" not in weights  # lm_head: the decoder's
    assert not (directory / "target_vocab.json").exists()  # one vocabulary
    check_export_matches_run(directory, workdir)
    import_marian(directory, tmp_path / "again")
    _assert_same_run(workdir, tmp_path / "again")


def test_equal_embeddings_still_export_in_the_shared_form(opus, tmp_path):
    directory = export_marian(opus, tmp_path / "hf")
    assert json.loads((directory / "config.json").read_text())["share_encoder_decoder_embeddings"] is True
    assert "model.shared.weight" in read_safetensors(directory / "model.safetensors")


def _with_own_target_vocabulary(workdir, output, vocab_size):
    """The run in `workdir` as one with separate vocabularies: a German tokenizer of `vocab_size`
    pieces for the target (the parameters are left as they are: the export refuses before them)."""
    step, metadata, params = load_checkpoint(workdir)
    target = train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=vocab_size)
    model = {**metadata.model, "share_embeddings": False, "source_vocab_size": metadata.model["vocab_size"]}
    model["vocab_size"] = target.vocab_size
    checkpointer = Checkpointer(RunDirectory(output).checkpoints, keep=None)
    checkpointer.save_params(step, params, metadata.replace(model=model, target_tokenizer=target.model_proto))
    checkpointer.close()
    return output


@pytest.mark.parametrize("sizes", ["equal", "different"])
def test_separate_vocabularies_are_refused_naming_the_option_whatever_their_sizes(opus, sizes, tmp_path):
    source_size = load_checkpoint(opus, params=False)[1].model_config().vocab_size
    workdir = _with_own_target_vocabulary(opus, tmp_path / "run", source_size if sizes == "equal" else 300)
    with pytest.raises(ConversionError, match=r"tokenizer\.separate_vocabularies=True exports only when its two"):
        export_marian(workdir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    """A MarianMT directory saved with share_encoder_decoder_embeddings=False (one vocab.json), its
    model, and its import."""
    directory = tmp_path_factory.mktemp("separate")
    model = write_marian(directory, share_encoder_decoder_embeddings=False)
    workdir = tmp_path_factory.mktemp("separate-run") / "run"
    return directory, model, workdir, import_marian(directory, workdir)


def test_separate_encoder_and_decoder_embeddings_are_imported_as_transformers_uses_them(separate):
    directory, model, workdir, converted = separate
    weights = read_safetensors(directory / "model.safetensors")
    assert "model.shared.weight" not in weights
    encoder, decoder = weights["model.encoder.embed_tokens.weight"], weights["model.decoder.embed_tokens.weight"]
    assert np.abs(encoder - decoder).max() > 0.1
    assert converted.config.tie_output_embedding  # lm_head is the decoder's

    logits, expected = teacher_forced_logits(directory, model, workdir, converted.order)
    marian_ids = np.arange(converted.config.vocab_size) != 3  # BOS's column has no Marian counterpart
    assert np.abs(logits[:, marian_ids] - expected[:, marian_ids]).max() < 1e-4


def test_separate_embeddings_that_transformers_would_not_load_are_refused(separate, tmp_path):
    directory = shutil.copytree(separate[0], tmp_path / "hf")
    weights = read_safetensors(directory / "model.safetensors")
    encoder = weights.pop("model.encoder.embed_tokens.weight")
    write_safetensors(directory / "model.safetensors", weights)  # transformers would initialize it randomly
    with pytest.raises(ConversionError) as refused:
        import_marian(directory, tmp_path / "run")
    assert str(refused.value) == (
        f"{directory / 'config.json'} has share_encoder_decoder_embeddings=false, but "
        f"{directory / 'model.safetensors'} has no model.encoder.embed_tokens.weight"
    )
    weights.update({"model.encoder.embed_tokens.weight": encoder, "model.shared.weight": encoder})
    write_safetensors(directory / "model.safetensors", weights)  # transformers has no model.shared there
    with pytest.raises(ConversionError, match=r"holds model\.shared\.weight, which a MarianMTModel of .* no place"):
        import_marian(directory, tmp_path / "run")
    assert not (tmp_path / "run").exists()


# -- untied output layers ---------------------------------------------------------------------


def _round_trip(directory, tmp_path):
    """The MarianMT model in `directory` imported, exported and imported again: (the first
    import's run, its export's config.json values, the model transformers loads from the export)."""
    import_marian(directory, tmp_path / "first")
    exported = export_marian(tmp_path / "first", tmp_path / "exported")
    import_marian(exported, tmp_path / "second")
    _assert_same_run(tmp_path / "first", tmp_path / "second")
    model, loading = MarianMTModel.from_pretrained(exported, output_loading_info=True)
    assert not any(loading.values()), loading  # no missing, unexpected or mismatched weights
    return tmp_path / "first", json.loads((exported / "config.json").read_text()), model.eval()


@pytest.mark.parametrize(
    ("made_with", "exported_as", "tolerance"),
    [
        # jaxformer scales its embeddings: the stored ones divided by sqrt(d_model), lm_head as it is;
        # the export scales them back, so transformers' logits move by float32 rounding (4e-6 measured)
        (dict(scale_embedding=False), dict(share_encoder_decoder_embeddings=True, scale_embedding=True), 1e-4),
        # transformers 5's own encoder, decoder and output matrices, written back as they were read
        (dict(tie_word_embeddings=False), dict(share_encoder_decoder_embeddings=False, scale_embedding=True), 0.0),
    ],
)
def test_a_model_imported_untied_exports_back_to_its_import(made_with, exported_as, tolerance, tmp_path):
    original = write_marian(tmp_path / "hf", **made_with)
    first, config, exported = _round_trip(tmp_path / "hf", tmp_path)
    assert {key: config[key] for key in exported_as} == exported_as and config["tie_word_embeddings"] is False

    # transformers computes with the export what it computed with the original, in the export's ids
    _, metadata, _ = load_checkpoint(first)
    assert not metadata.model["tie_output_embedding"]
    order = import_marian(tmp_path / "hf", tmp_path / "again").order
    tokenizer = MarianTokenizer.from_pretrained(tmp_path / "hf")
    batch = tokenizer(sentences(3), text_target=read_raw("val.de.gz")[:3], padding=True, return_tensors="pt")
    labels, pad = batch["labels"], original.config.pad_token_id
    decoder_inputs = torch.cat([torch.full_like(labels[:, :1], pad), labels[:, :-1]], dim=1)
    to_jaxformer = torch.from_numpy(marian_to_jaxformer_ids(order))
    exported_inputs = to_jaxformer[decoder_inputs]
    exported_inputs[:, 0] = 3  # the export decodes from its BOS
    with torch.no_grad():
        expected = original(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_inputs
        ).logits[..., order]
        logits = exported(
            input_ids=to_jaxformer[batch["input_ids"]],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=exported_inputs,
        ).logits
    valid = (labels != pad).numpy()
    columns = np.arange(len(order)) != 3  # BOS's column has no Marian counterpart
    assert np.abs(logits.numpy()[valid][:, columns] - expected.numpy()[valid][:, columns]).max() <= tolerance


@pytest.mark.slow  # to the slow set (about 8 s): the default suite ran 10 min 28 s on a 2-core Intel VM (2026-12-06)
def test_an_untied_run_exports_with_its_output_kernel(tmp_path):
    workdir, params, _ = make_workdir(tmp_path / "run")  # interleaved positions: lm_head's width permuted too

    def untied(params):
        kernel = np.asarray(params["shared_embedding"]["embedding"]).T
        generator = np.random.default_rng(0)
        decoder = {**params["decoder"], "logits_kernel": generator.standard_normal(kernel.shape, np.float32) * 0.3}
        return {**params, "decoder": decoder}

    workdir = rewritten_run(workdir, tmp_path / "untied", untied, tie_output_embedding=False)
    directory = export_marian(workdir, tmp_path / "hf")
    config = json.loads((directory / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["share_encoder_decoder_embeddings"] is True
    check_export_matches_run(directory, workdir)


def test_an_untied_model_without_lm_head_is_refused_first_naming_its_files(tmp_path, caplog):
    """The refusal named config.json without its folder, after the warnings of building the
    tokenizers (source.spm's and target.spm's pieces that vocab.json lacks): it comes first now."""
    directory = tmp_path / "hf"
    write_marian(directory, tie_word_embeddings=False)
    weights = read_safetensors(directory / "model.safetensors")
    del weights["lm_head.weight"]  # transformers would initialize it randomly
    write_safetensors(directory / "model.safetensors", weights)
    vocab = json.loads((directory / "vocab.json").read_text())
    del vocab["s"]  # a piece of both sides' models: a warning for each once the tokenizers are built
    (directory / "vocab.json").write_text(json.dumps(vocab))
    with caplog.at_level(logging.WARNING), pytest.raises(ConversionError) as refused:
        import_marian(directory, tmp_path / "run")
    assert str(refused.value) == (
        f"{directory / 'config.json'} has tie_word_embeddings=false, but {directory / 'model.safetensors'} "
        "has no lm_head.weight"
    )
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert not (tmp_path / "run").exists()


def test_an_untied_checkpoint_without_its_output_kernel_is_refused_naming_it(tmp_path):
    """--to_hf failed with KeyError 'decoder/logits_kernel' where the metadata said untied."""
    workdir, _, _ = make_workdir(tmp_path / "run")
    untied = rewritten_run(workdir, tmp_path / "untied", tie_output_embedding=False)  # no kernel added
    with pytest.raises(ConversionError) as refused:
        export_marian(untied, tmp_path / "hf")
    assert str(refused.value) == (
        f"step 1 of {untied} (latest checkpoint) holds no decoder/logits_kernel, which its metadata's model has "
        "(tie_output_embedding=False: an output layer of its own)"
    )
    assert not (tmp_path / "hf").exists()
