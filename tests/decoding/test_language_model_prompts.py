"""What a decoder-only model's prompt may hold: a text's ids without EOS, as LanguageModel encodes
text. Checked before anything is compiled, by LanguageModel.continue_ids and, on concrete arrays,
continue_prompts; and the sampling seed LanguageModel takes, checked before anything is read."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.commands import generate as generate_command
from jaxformer.commands import translate as translate_command
from jaxformer.data.sentencepiece_proto import model_pb2
from jaxformer.data.tokenizer import Tokenizer, train_tokenizer
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.language_model import (
    LANGUAGE_MODEL_MAKES_NONE,
    LanguageModel,
    check_prompt_rows,
    checked_prompts,
    continue_prompts,
)
from jaxformer.errors import CheckpointError
from jaxformer.model.config import preset
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.run.directory import CHECKPOINT_KINDS
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from jaxformer.training import experiment
from tests.conftest import assert_option_refused, assert_seed_refused, read_raw, save_checkpoints

SETTINGS = DecodeSettings(method="greedy", max_extra_length=3)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=300)


@pytest.fixture(scope="module")
def language_model(tokenizer):
    config = preset("tiny", architecture="decoder_only", vocab_size=tokenizer.vocab_size, num_decoder_layers=1)
    # Random parameters of the model's shapes, without compiling its initialisation (seconds).
    shapes = nn.meta.unbox(jax.eval_shape(DecoderOnly(config).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda leaf: rng.normal(0.0, 0.1, leaf.shape).astype(leaf.dtype), shapes["params"])
    return LanguageModel(config, params, tokenizer, SETTINGS)


def not_compiled(*_):
    raise AssertionError("the search was run: the prompt should have been refused before it")


REFUSED = [
    ([5, 6, EOS_ID], r"^prompt 1 has EOS \(1\) at position 2: a prompt is the start of a text"),
    ([5, EOS_ID, 6], r"^prompt 1 has EOS \(1\) at position 1: "),
    ([EOS_ID], r"^prompt 1 has EOS \(1\) at position 0: "),
    ([BOS_ID, 5], r"^prompt 1 has BOS \(3\) at position 0: "),
    ([5, 6, PAD_ID, PAD_ID], r"^prompt 1 has PAD \(0\) at position 2: "),
    ([5, 300], r"^prompt 1: id 300 at position 1 is outside the model's vocabulary \[0, 300\)$"),
    ([-1], r"^prompt 1: id -1 at position 0 is outside the model's vocabulary \[0, 300\)$"),
    ([[5, 6]], r"^prompt 1 must be one prompt's ids \(1-D\), got shape \(1, 2\)$"),
]


@pytest.mark.parametrize(
    "prompt,message", REFUSED, ids=["eos-end", "eos-inside", "eos-alone", "bos", "pad", "vocab", "negative", "2d"]
)
def test_continue_ids_refuses_a_prompt_that_is_not_the_start_of_a_text(language_model, monkeypatch, prompt, message):
    monkeypatch.setattr(language_model, "_continue", not_compiled)
    with pytest.raises(ValueError, match=message):
        language_model.continue_ids([np.array([7, 8]), np.array(prompt)])  # when called, not when iterated
    with pytest.raises(TypeError, match=r"^prompt 0's ids must be integers, got dtype float64$"):
        language_model.continue_ids([np.array([7.0])])
    with pytest.raises(TypeError, match="not one of shape"):
        language_model.continue_ids(np.array([7, 8]))


def test_continue_prompts_refuses_concrete_rows_holding_eos(language_model):
    model = DecoderOnly(language_model.config)
    rows = np.array([[5, 6, 7], [8, EOS_ID, 9]], np.int32)
    for given in (rows, jnp.asarray(rows)):
        with pytest.raises(ValueError, match=r"^prompt row 1 has EOS \(1\) at position 1: "):
            continue_prompts(model, language_model.params, given, SETTINGS)
    with pytest.raises(ValueError, match=r"^prompts must be ids \[batch, length\], got shape \(3,\)$"):
        check_prompt_rows(rows[0], language_model.config.vocab_size)  # continue_prompts' own check, unannotated
    # A nested list failed at `prompts.shape` ("'list' object has no attribute 'shape'"), naming nothing.
    with pytest.raises(TypeError) as error:
        check_prompt_rows(rows.tolist(), language_model.config.vocab_size)
    assert str(error.value) == "prompts must be ids [batch, length] in an array, got a list: pass jnp.asarray(prompts)"


def test_continue_prompts_refuses_a_seed_given_for_its_key(language_model, monkeypatch):
    import jaxtyping

    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # a user's call: no annotation checks
    model, rows = DecoderOnly(language_model.config), np.array([[5, 6, 7]], np.int32)
    sampling = DecodeSettings(method="sample", max_extra_length=3)
    for seed in (7, np.int32(7)):
        with pytest.raises(TypeError, match=r"^rng must be a random key, got the int 7: pass jax\.random\.key\(7\)$"):
            continue_prompts(model, language_model.params, rows, sampling, seed)


def test_text_prompts_and_the_empty_prompt_are_accepted(language_model, tokenizer):
    """LanguageModel encodes a text without EOS, and no text encodes to EOS, BOS or PAD (control
    pieces), written out or not; whitespace alone encodes to no id: unconditional generation."""
    texts = ["", " ", "\u200b", "Ein Mann", "Ein Mann </s> mit <s> und <pad>", *read_raw("val.de.gz", 200)]
    encoded = [tokenizer.encode(text, add_eos=False) for text in texts]
    assert all(UNK_ID in ids for ids in encoded[4:5]) and encoded[0].size == 0
    assert [ids.tolist() for ids in checked_prompts(encoded, tokenizer.vocab_size)] == [ids.tolist() for ids in encoded]
    assert checked_prompts([[]], tokenizer.vocab_size)[0].dtype == np.int32  # [] is a prompt of no ids
    continued = {}
    for indices, tokens, _ in language_model.continue_ids([np.zeros(0, np.int32), [5, 6]]):
        continued.update({index: tokens[row, 0] for row, index in enumerate(indices)})
    assert sorted(continued) == [0, 1] and all(np.all(tokens != BOS_ID) for tokens in continued.values())


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_size_below_1_is_refused_before_anything_is_read(language_model, tmp_path, batch_size):
    """As Translator refuses it: at 0 range() failed at the first prompt, below 0 no prompt was
    continued (complete_nbest gave None for each prompt, complete a TypeError); from_workdir read the
    checkpoint first."""
    parts = (language_model.config, language_model.params, language_model.tokenizer, SETTINGS)
    message = f"batch_size must be an integer >= 1, got {batch_size}"
    assert_option_refused(LanguageModel, parts, {"batch_size": batch_size}, message, tmp_path / "no run")


def test_a_seed_that_jax_would_take_for_another_is_refused_before_anything_is_read(language_model, tmp_path):
    parts = (language_model.config, language_model.params, language_model.tokenizer, SETTINGS)
    assert LanguageModel(*parts, seed=2**32 - 1).settings == SETTINGS
    for seed in (2**32, -1):  # jax.random.key would take them for 0 and 2**32 - 1
        assert_seed_refused(LanguageModel, parts, seed, tmp_path / "no run")


@pytest.fixture(scope="module")
def word_continuing_model(language_model, tokenizer):
    """The random model with its output pulled towards a piece that continues a word ("n"): its
    last LayerNorm's bias is that piece's embedding, lengthened, so every step's logits favour it."""
    pieces = tokenizer.pieces(range(tokenizer.vocab_size))
    piece = next(i for i in range(4, tokenizer.vocab_size) if not pieces[i].startswith("\u2581"))
    params = jax.tree.map(np.array, language_model.params)
    params["embedding"]["embedding"][piece] *= 3
    params["decoder"]["layer_0"]["feed_forward_norm"]["bias"] = params["embedding"]["embedding"][piece].copy()
    return LanguageModel(language_model.config, params, tokenizer, SETTINGS), piece


def test_a_prompt_that_ends_in_a_space_is_continued_with_a_new_word(word_continuing_model, tokenizer):
    """Sentencepiece drops a prompt's trailing space, so "Ein Hund läuft " encodes as "Ein Hund
    läuft" does, and the continuation went on with "läuft" (läuftn...) where the prompt asked for a
    new word. It now starts with a piece that begins a word; a prompt without the space, in the same
    batch, is continued as before. Both against greedy search by full forward passes."""
    lm, piece = word_continuing_model
    prompts = ["Ein Hund läuft", "Ein Hund läuft ", "Ein Hund läuft\t"]
    encoded = [tokenizer.encode(prompt, add_eos=False) for prompt in prompts]
    assert all(np.array_equal(ids, encoded[0]) for ids in encoded)  # one batch: the same ids
    word_starts = np.array([text.startswith("\u2581") for text in tokenizer.pieces(range(tokenizer.vocab_size))])
    model = DecoderOnly(lm.config)
    forward = jax.jit(lambda params, inputs: model.apply({"params": params}, inputs))
    expected = {}
    for new_word in (False, True):  # the reference: one full forward pass per new token
        sequence = [BOS_ID, *encoded[0]]
        while len(sequence) < 1 + len(encoded[0]) + SETTINGS.max_extra_length and sequence[-1] != EOS_ID:
            # Padded to one length (one compilation): a causal model's logits do not depend on what follows.
            logits = np.array(forward(lm.params, jnp.asarray([(sequence + [PAD_ID] * 16)[:16]]))[0, len(sequence) - 1])
            logits[[PAD_ID, BOS_ID]] = -np.inf
            if new_word and len(sequence) == 1 + len(encoded[0]):
                logits[~word_starts & (np.arange(len(logits)) != EOS_ID)] = -np.inf
            sequence.append(int(np.argmax(logits)))
        expected[new_word] = sequence[1 + len(encoded[0]) :]
    assert expected[False][0] == piece and word_starts[expected[True][0]]  # the model tells the two apart

    completed = lm.complete(prompts)
    continuations = [tokenizer.decode(expected[prompt[-1:].isspace()]) for prompt in prompts]
    assert completed == [prompt + continuation for prompt, continuation in zip(prompts, continuations)]
    assert completed[1].startswith("Ein Hund läuft " + tokenizer.pieces(expected[True][:1])[0][1:])
    [(indices, tokens, _)] = list(lm.continue_ids(encoded, [False, True, True]))
    for index, row in zip(indices, tokens[:, 0]):
        assert hypothesis_ids(row) == expected[index > 0], prompts[index]
    with pytest.raises(ValueError, match=r"^new_words has 1 flags for 3 prompts: give one per prompt$"):
        lm.continue_ids(encoded, [True])


def test_a_files_line_break_ends_the_prompts_line_not_the_prompt(word_continuing_model, tmp_path):
    """complete() takes a file's lines, as jaxformer-generate --input reads the file: the line break
    was kept as the prompt's last character, printed between it and its continuation, and taken for
    whitespace, so the continuation started a new word where the command went on with the last one."""
    lm, _ = word_continuing_model
    path = tmp_path / "prompts.de"
    path.write_bytes("Ein Hund läuft\nEin Hund läuft \r\nEin Hund läuft".encode())
    as_the_command_reads_them = ["Ein Hund läuft", "Ein Hund läuft ", "Ein Hund läuft"]
    expected = lm.complete(as_the_command_reads_them)
    assert expected[0] != expected[1].replace("läuft ", "läuft", 1)  # the model tells the two apart
    for newline in (None, ""):  # universal newlines, and the line breaks as written
        with open(path, encoding="utf-8", newline=newline) as lines:
            assert lm.complete(lines) == expected


def hypothesis_ids(tokens):
    tokens = [int(token) for token in tokens]
    return tokens[: tokens.index(EOS_ID) + 1] if EOS_ID in tokens else tokens


def test_a_tokenizer_that_marks_no_word_starts_leaves_a_trailing_space_as_it_was(language_model, tokenizer):
    model = model_pb2.ModelProto()
    model.ParseFromString(tokenizer.model_proto)
    model.trainer_spec.treat_whitespace_as_suffix = True  # word ends marked: no piece is known to begin a word
    lm = LanguageModel(language_model.config, language_model.params, Tokenizer(model.SerializeToString()), SETTINGS)
    calls = []

    def recorded(params, rows, rng, new_words):
        calls.append(new_words)
        return np.zeros((len(rows), 1, 3), np.int32), np.zeros((len(rows), 1), np.float32)

    lm._continue = recorded
    assert lm.complete(["Ein Hund läuft "]) == ["Ein Hund läuft "] and calls == [None]


def lm_workdir(workdir, lm):
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.model.architecture = "decoder_only"
    save_checkpoints(workdir, config, lm.config, lm.tokenizer, {1: lm.params})
    return workdir


@pytest.mark.parametrize("checkpoint", ["best", "final"])
def test_a_checkpoint_only_a_translator_keeps_is_refused_with_what_to_choose(language_model, tmp_path, checkpoint):
    """best/ and final/ are kept by validation BLEU, which a language model's run is refused; the
    loaders said only that best/ did not exist, and for final/ advised training.final_choice=True,
    which the run's training command then refused."""
    workdir = lm_workdir(tmp_path / "run", language_model)
    with pytest.raises(CheckpointError) as refused:
        LanguageModel.from_workdir(workdir, checkpoint)
    assert str(refused.value).startswith(f"{workdir} has no {checkpoint!r} checkpoint: {checkpoint}/ holds ")
    assert str(refused.value).endswith(
        "which a language model's run, translating nothing, never has; choose latest, averaged or a step number"
    )
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("checkpoint", ["best", "final"])
def test_the_command_refuses_them_so_under_beam_search_too(language_model, tmp_path, capsys, checkpoint):
    """Beam search's flags take their defaults from final/'s search (decoding_flags.final_search),
    read before the model: jaxformer-generate --checkpoint final --method beam said instead that
    the run had made no final choice and that training.final_choice=True makes it, which a
    language model's training refuses."""
    workdir = lm_workdir(tmp_path / "run", language_model)
    with pytest.raises(CheckpointError) as refused:
        LanguageModel.from_workdir(workdir, checkpoint)
    (tmp_path / "prompts.txt").write_text("Ein Hund\n", encoding="utf-8")
    for method in ("beam", "greedy"):
        flags = ["--workdir", str(workdir), "--checkpoint", checkpoint, "--method", method]
        assert generate_command.main([*flags, "--input", str(tmp_path / "prompts.txt")]) == 2
        assert capsys.readouterr().err == f"error: {refused.value}\n"


def options_help(command, capsys) -> str:
    """The options part of `command --help`, its lines joined."""
    with pytest.raises(SystemExit):
        command.main(["--help"])
    return " ".join(capsys.readouterr().out.split("options:")[1].split())


def test_generates_help_offers_only_what_a_language_models_run_has(capsys):
    """jaxformer-generate --help offered --checkpoint best and final, and defaults for --alpha,
    --length_penalty and --renormalize_after_bans taken with --checkpoint final, which the test
    above refuses; translate's help, whose runs have them, still offers them."""
    help_text = options_help(generate_command, capsys)
    offered = re.search(r"--checkpoint CHECKPOINT (.*?) \(default: latest\)", help_text).group(1)
    kept = [kind for kind in CHECKPOINT_KINDS if kind not in LANGUAGE_MODEL_MAKES_NONE]
    assert [kind for kind in CHECKPOINT_KINDS if re.search(rf"\b{kind}\b", offered)] == kept, offered
    assert "step number" in offered
    for refused in LANGUAGE_MODEL_MAKES_NONE:
        assert not re.search(rf"\b{refused}\b", help_text), help_text
    translation = options_help(translate_command, capsys)
    assert all(re.search(rf"\b{kind}\b", translation) for kind in CHECKPOINT_KINDS)
    assert translation.count("with --checkpoint final") >= 3  # --alpha's, --length_penalty's, renormalising's


@pytest.mark.slow  # about 6 s: a greedy, a sampling and a beam search compiled, through the command
@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
def test_the_command_continues_a_prompt_that_ends_in_a_space_with_a_new_word(
    word_continuing_model, tokenizer, tmp_path, method
):
    """jaxformer-generate prints what LanguageModel.complete gives (the test above: a new word
    after a trailing space), the prompt's space kept, for every search."""
    lm, piece = word_continuing_model
    workdir = lm_workdir(tmp_path / "run", lm)
    prompts = ["Ein Hund läuft", "Ein Hund läuft "]  # one batch: the same ids
    (tmp_path / "prompts.txt").write_text("".join(f"{prompt}\n" for prompt in prompts), encoding="utf-8")
    flags = ["--method", method, "--max_new_tokens", "3", "--batch_size", "2"]
    flags += {"greedy": [], "sample": ["--seed", "7", "--temperature", "0.1"], "beam": ["--beam_size", "2"]}[method]
    files = ["--input", str(tmp_path / "prompts.txt"), "--output", str(tmp_path / "out.txt")]
    assert generate_command.main(["--workdir", str(workdir), *flags, *files]) == 0
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1]
    settings = DecodeSettings(method=method, max_extra_length=3, beam_size=2, temperature=0.1)
    same = LanguageModel(lm.config, lm.params, tokenizer, settings, batch_size=2, seed=7)
    assert lines == same.complete(prompts)
    assert lines[0].startswith(prompts[0]) and lines[1].startswith(prompts[1])
    went_on, new_word = lines[0][len(prompts[0]) :], lines[1][len(prompts[1]) :]
    # The same ids, continued alike before: now the model's favourite piece, which goes on with a
    # word, is the other's start, and the line holds one space between the two words.
    assert new_word[:1] not in ("", " ") and new_word != went_on, lines
