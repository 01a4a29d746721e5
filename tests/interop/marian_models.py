"""Tiny MarianMT models made and saved with transformers, for the interop tests: random weights
large enough that outputs depend on the input, and a joint vocabulary of two sentencepiece
models trained on Multi30k, as OPUS-MT's are made. Imported by test modules after their
pytest.importorskip of transformers and torch."""

import io
import json

import numpy as np
import sentencepiece as spm
import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.interop.marian_layout import marian_to_jaxformer_ids
from jaxformer.model.transformer import Transformer
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from tests.conftest import read_raw

MAX_EXTRA = 8  # output tokens <= source tokens + this, in both libraries
ALPHA = 0.6


def train_spm(lines, vocab_size):
    """A sentencepiece model as OPUS-MT's are trained: sentencepiece's own ids (unk 0, bos 1, eos 2)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type="unigram"
    )
    return model.getvalue()


def marian_vocab(*protos):
    """Marian's vocab.json: </s> 0, <unk> 1, every piece of either model once, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for proto in protos:
        processor = spm.SentencePieceProcessor(model_proto=proto)
        for index in range(processor.get_piece_size()):
            piece = processor.id_to_piece(index)
            if not (processor.is_control(index) or processor.is_unknown(index)):
                vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def randomize(model):
    """Weights large enough that outputs depend on the input (transformers' init is std 0.02)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:  # the sinusoids, kept
                continue
            if "layer_norm" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(base + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                std = 0.1 if name.endswith("bias") else 0.25
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))
        bias = 0.5 * torch.randn(model.final_logits_bias.shape, generator=generator)
        bias[0, model.config.eos_token_id] += 2.0  # sentences end before the length limit
        model.final_logits_bias.copy_(bias)


def write_marian(directory, **overrides):
    """A tiny MarianMT model (swish, nonzero final_logits_bias; MarianConfig values `overrides`)
    saved with its tokenizer files in `directory`, its generation_config.json banning pad as
    OPUS-MT's do; returns the model."""
    english, german = read_raw("train.en.gz", 400), read_raw("train.de.gz", 400)
    source_spm, target_spm = train_spm(english, 150), train_spm(german, 150)
    vocab = marian_vocab(source_spm, target_spm)
    pad = vocab["<pad>"]
    values = dict(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        decoder_start_token_id=pad,
    )
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(**{**values, **overrides})).eval()
    randomize(model)
    model.generation_config.bad_words_ids = [[pad]]  # OPUS-MT's: generate never outputs pad, as jaxformer's search
    model.save_pretrained(directory)
    (directory / "source.spm").write_bytes(source_spm)
    (directory / "target.spm").write_bytes(target_spm)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = MarianTokenizer(
        str(directory / "source.spm"),
        str(directory / "target.spm"),
        str(directory / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    tokenizer.save_pretrained(directory)
    return model


def sentences(count, offset=0):
    return read_raw("val.en.gz")[offset : offset + count]


def hf_generate(
    model, input_ids, limit, num_beams, pad_id, start_id, eos_id, bad_ids, early_stopping="never", renormalize=False
):
    """transformers' search with the settings under which jaxformer's is the same search (see
    test_marian.py's test_search_matches_transformers_generate): (the hypotheses, their scores;
    under greedy search None, or with `renormalize` the sum of the chosen tokens' log-probabilities,
    which renormalize_logits makes each step's scores)."""
    settings = GenerationConfig(
        max_new_tokens=limit,
        num_beams=num_beams,
        num_return_sequences=num_beams,
        do_sample=False,
        length_penalty=ALPHA,
        early_stopping=early_stopping,
        decoder_start_token_id=start_id,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        forced_eos_token_id=eos_id,
        bad_words_ids=[[token] for token in bad_ids],
        return_dict_in_generate=True,
        output_scores=True,
        renormalize_logits=renormalize,
    )
    with torch.no_grad():
        output = model.generate(input_ids=torch.tensor([input_ids]), generation_config=settings)
    sequences = [until_eos(row[1:], eos_id) for row in output.sequences.numpy()]
    if num_beams > 1:
        return sequences, output.sequences_scores.numpy()
    if not renormalize:  # greedy search's scores are then the processed logits, no log-probabilities
        return sequences, None
    chosen = [float(step_scores[0, token]) for step_scores, token in zip(output.scores, sequences[0])]
    return sequences, np.asarray([sum(chosen)])


def until_eos(ids, eos_id):
    ids = [int(token) for token in ids]
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


def teacher_forced_logits(directory, model, workdir, order, count=6):
    """The logits of the imported run in `workdir` and of transformers' `model` (saved in
    `directory`) on `count` validation pairs, both in jaxformer's ids (`order`: the import's
    vocabulary order), at the target positions that are not padding. ([N, V], [N, V])"""
    tokenizer = MarianTokenizer.from_pretrained(directory)
    batch = tokenizer(sentences(count), text_target=read_raw("val.de.gz")[:count], padding=True, return_tensors="pt")
    labels = batch["labels"]
    pad = model.config.pad_token_id
    decoder_inputs = torch.cat([torch.full_like(labels[:, :1], pad), labels[:, :-1]], dim=1)
    with torch.no_grad():
        expected = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_inputs
        ).logits.numpy()[..., order]  # [B, T, V] in jaxformer's ids

    to_jaxformer = marian_to_jaxformer_ids(order)
    source = to_jaxformer[batch["input_ids"].numpy()]  # padding -> 0
    target = to_jaxformer[decoder_inputs.numpy()]
    target[:, 0] = 3  # BOS, the copy of Marian's decoder start
    target[labels.numpy() == pad] = 0
    translator = Translator.from_workdir(workdir)
    logits = Transformer(translator.config).apply({"params": translator.params}, source, target)
    valid = labels.numpy() != pad
    return np.asarray(logits)[valid], expected[valid]


def rewritten_run(workdir, output, change_params=lambda params: params, **model):
    """A copy of the run in `workdir` as `output` with the model fields `model` changed and its
    parameters passed through `change_params`."""
    step, metadata, params = load_checkpoint(workdir)
    checkpointer = Checkpointer(RunDirectory(output).checkpoints, keep=None)
    checkpointer.save_params(step, change_params(params), metadata.replace(model={**metadata.model, **model}))
    checkpointer.close()
    return output


def check_export_matches_run(directory, workdir, count=5):
    """Asserts that the transformers directory `directory`, exported from the run in `workdir`,
    loads with every weight in its place and gives the run's tokenization, teacher-forced logits
    (within 1e-4) and greedy outputs (in the run's ids, which the export keeps)."""
    model, loading = MarianMTModel.from_pretrained(directory, output_loading_info=True)
    assert not any(loading.values()), loading  # no missing, unexpected or mismatched weights
    model.eval()
    tokenizer = MarianTokenizer.from_pretrained(directory)
    translator = Translator.from_workdir(workdir, settings=DecodeSettings(method="greedy", max_extra_length=MAX_EXTRA))
    texts, targets = sentences(count), read_raw("val.de.gz")[:count]
    for text in texts:  # the same ids from MarianTokenizer as from the run's tokenizer
        assert tokenizer(text)["input_ids"] == translator.tokenizer.encode(text).tolist()

    batch = tokenizer(texts, text_target=targets, padding=True, return_tensors="pt")
    labels = batch["labels"].numpy()
    decoder_inputs = np.concatenate([np.full_like(labels[:, :1], 3), labels[:, :-1]], axis=1)
    decoder_inputs[labels == 0] = 0
    with torch.no_grad():
        expected = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=torch.from_numpy(decoder_inputs),
        ).logits.numpy()
    logits = Transformer(translator.config).apply(
        {"params": translator.params}, batch["input_ids"].numpy(), decoder_inputs
    )
    valid = labels != 0
    assert np.abs(np.asarray(logits)[valid] - expected[valid]).max() < 1e-4

    sources = [translator.tokenizer.encode(text) for text in texts]
    for ids, hypotheses in zip(sources, translator.translate_ids(sources), strict=True):
        expected, _ = hf_generate(model, ids.tolist(), len(ids) + MAX_EXTRA, 1, 0, 3, 1, [0, 3])
        assert [until_eos(hypotheses[0][0], 1)] == expected
