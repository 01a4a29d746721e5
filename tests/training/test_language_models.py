"""The encoder-only (masked LM) and decoder-only (causal LM) configs end to end at the tiny size:
training, exact resume, generation, and their refusal as translators (a translator composed from
the two: test_composed_translator.py)."""

import inspect
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.commands import generate as generate_command
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.language_model import CONTINUATION_TOKENS, LanguageModel, continue_prompts
from jaxformer.decoding.translator import Translator
from jaxformer.model.config import ConfigError
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.model.transformer import shift_right
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_checkpoint
from jaxformer.tokens import BOS_ID, EOS_ID
from jaxformer.training.config_file import apply_overrides, load_config
from jaxformer.training.unused_settings import unused_keys, unused_settings
from tests.training.test_loop import ROOT, environment, losses, train

pytestmark = pytest.mark.xdist_group("language-models")  # with test_composed_translator.py: one worker trains the runs

# The shipped configs, shrunk to the tiny preset's width with one layer per stack: what these tests
# check (learning, exact resume, generation, composing a translator from the two) holds at any
# depth, every parameter kind is in layer_0, and each program compiles in about two thirds of the
# time two layers take (docs/test_suite.md).
TINY = [
    "--config.model.d_model=32",
    "--config.model.num_heads=4",
    "--config.model.d_ff=64",
    "--config.model.num_encoder_layers=1",
    "--config.model.num_decoder_layers=1",
    "--config.data.max_length=48",
    "--config.data.batch_size=8",
    "--config.data.eval_batch_size=8",
    "--config.data.max_eval_examples=64",
    "--config.data.num_threads=0",
    "--config.data.encode_once_max_examples=0",  # read only the pairs 40 steps draw (as configs/tiny.py)
    "--config.tokenizer.vocab_size=600",
    "--config.tokenizer.max_sentences=4000",
    "--config.optimizer.warmup_steps=30",
    "--config.optimizer.learning_rate_scale=2.0",
    "--config.training.num_train_steps=40",
    "--config.training.log_every_steps=1",
    "--config.training.eval_every_steps=20",
    "--config.training.checkpoint_every_steps=20",
]


def config_flag(name):
    return f"--config={ROOT / 'jaxformer' / 'configs' / name}.py"


NAMES = ("multi30k_mlm", "multi30k_lm")


@pytest.fixture(scope="module")
def runs(trained_language_models):
    return trained_language_models[0]


@pytest.mark.parametrize("name", NAMES)
def test_trains_and_reports_its_validation_figures(runs, name):
    workdir = runs[name]
    train_losses = losses(workdir)
    assert sorted(train_losses) == list(range(1, 41))
    assert np.mean([train_losses[s] for s in range(36, 41)]) < np.mean([train_losses[s] for s in range(1, 6)]) - 0.5
    perplexity, accuracy = losses(workdir, "eval/perplexity"), losses(workdir, "eval/accuracy")
    assert set(perplexity) == {20, 40} and perplexity[40] < perplexity[20] < 600  # better than uniform
    assert 0.0 < accuracy[40] < 1.0
    step, metadata, _ = load_checkpoint(workdir)
    tokenizer = metadata.load_tokenizer()
    assert step == 40 and tokenizer.vocab_size == 600
    expected = "encoder_only" if name == "multi30k_mlm" else "decoder_only"
    assert metadata.model_config().architecture == expected
    assert (tokenizer.mask_id is not None) == (expected == "encoder_only")  # only a masked LM has a mask piece
    # The masked LM reads English (the source side), the causal LM German: each vocabulary splits
    # its own language into fewer pieces.
    english = len(tokenizer.encode("A man in a blue shirt is riding a bicycle down the street."))
    german = len(tokenizer.encode("Ein Mann in einem blauen Hemd fährt mit dem Fahrrad die Straße entlang."))
    assert (english < german) == (expected == "encoder_only"), (english, german)


@pytest.mark.parametrize("name", NAMES)
def test_its_log_counts_texts_not_pairs(trained_language_models, name):
    """A language model reads one language's texts: its log called them "training pairs"."""
    log = trained_language_models[1][name]
    language = "en" if name == "multi30k_mlm" else "de"
    assert re.search(rf"<unk> pieces on [\d,]+ training texts: {language} [\d.]+%\n", log), log[-3000:]
    assert re.search(
        r"step 40: validation loss .*; the length filter dropped \d+ of the [\d,]+ training texts read since the run "
        r"started\n",
        log,
    ), log[-3000:]
    assert "training pairs" not in log, log[-3000:]


# slow: the causal LM's resume (about 6 s, a run of 20 steps); covered in the default suite by
# test_resume_is_exact[multi30k_mlm] (the masked LM's, its masks drawn again too) and
# tests/training/test_loop.py's test_exact_resume_after_sigkill (a decoder trained the same way).
@pytest.mark.parametrize("name", ["multi30k_mlm", pytest.param("multi30k_lm", marks=pytest.mark.slow)])
def test_resume_is_exact(runs, name, data_dir, tmp_path):
    workdir = runs[name]
    resumed = tmp_path / "resumed"
    shutil.copytree(workdir, resumed)
    shutil.rmtree(resumed / "checkpoints" / "40")  # as if the run had stopped after step 20's checkpoint
    result = train(resumed, data_dir, config_flag(name), *TINY)
    assert "resumed from step 20" in result.stderr
    assert losses(resumed) == losses(workdir)  # bitwise: steps 21 to 40 as the resumed run logged them
    assert losses(resumed, "eval/loss") == losses(workdir, "eval/loss")
    _, _, straight_params = load_checkpoint(workdir)
    _, _, resumed_params = load_checkpoint(resumed)
    assert jax.tree.all(jax.tree.map(np.array_equal, straight_params, resumed_params))


def test_greedy_continuation_equals_argmax_of_full_forward_passes(runs):
    workdir = runs["multi30k_lm"]
    step, metadata, params = load_checkpoint(workdir)
    config, tokenizer = metadata.model_config(), metadata.load_tokenizer()
    new_tokens = 10
    lm = LanguageModel(config, params, tokenizer, DecodeSettings(method="greedy", max_extra_length=new_tokens))
    prompts = ["Ein Mann", "Zwei Hunde", "Eine Frau mit"]
    encoded = [tokenizer.encode(prompt, add_eos=False) for prompt in prompts]
    model = DecoderOnly(config.replace(deterministic=True))
    forward = jax.jit(lambda params, targets: model.apply({"params": params}, shift_right(targets)))
    for prompt, ids in zip(prompts, encoded):
        sequence = list(ids)
        for _ in range(new_tokens):  # the reference: one full forward pass per new token
            # Padded to one length (one compilation); a causal model's logits at a position do not
            # depend on what follows it.
            targets = jnp.asarray([(sequence + [EOS_ID] + [0] * 32)[:32]], jnp.int32)
            logits = forward(params, targets)[0, len(sequence)]
            logits = logits.at[jnp.asarray([0, BOS_ID])].set(-jnp.inf)  # never pad or BOS
            sequence.append(int(jnp.argmax(logits)))
            if sequence[-1] == EOS_ID:
                break
        assert lm.complete([prompt])[0] == tokenizer.decode(sequence), prompt
    assert lm.complete(prompts) == [lm.complete([prompt])[0] for prompt in prompts]  # grouped by length


def test_a_continuation_is_greedy_unless_told_otherwise(runs):
    """LanguageModel searched with translation's beam 4 unless given settings, unlike jaxformer-generate
    and transformers' generate (beam search favours dull, repetitive continuations of open-ended text),
    and added up to 50 tokens where jaxformer-generate adds 30."""
    step, metadata, params = load_checkpoint(runs["multi30k_lm"])
    new_tokens = generate_command.build_parser().parse_args(["--workdir", "w"]).max_new_tokens
    greedy = DecodeSettings(method="greedy", max_extra_length=new_tokens)
    assert LanguageModel(metadata.model_config(), params, metadata.load_tokenizer()).settings == greedy
    assert LanguageModel.from_workdir(runs["multi30k_lm"]).settings == greedy
    assert inspect.signature(continue_prompts).parameters["settings"].default == greedy


def test_from_workdir_reads_the_checkpoints_metadata_once(runs, monkeypatch):
    """LanguageModel.from_workdir read the checkpoint's metadata file twice, once to check the
    architecture and the search, again with the parameters; it now checks them from the one read,
    before the parameters, as Translator.from_workdir does."""
    read_json, reads = Checkpointer._read_json, []

    def counted(self, step):
        reads.append(step)
        return read_json(self, step)

    monkeypatch.setattr(Checkpointer, "_read_json", counted)
    assert LanguageModel.from_workdir(runs["multi30k_lm"]).settings.method == "greedy"
    assert len(reads) == 1


@pytest.mark.slow  # about 5 s: a greedy and a beam search compiled (both prompts are 2 pieces)
def test_the_default_continuation_is_the_greedy_one_not_the_beam_one(runs):
    step, metadata, params = load_checkpoint(runs["multi30k_lm"])
    config, tokenizer, prompts = metadata.model_config(), metadata.load_tokenizer(), ["Ein Mann", "Zwei Hunde"]
    # 40 steps may leave a model that repeats one word whatever the search (greedy and beam then write
    # the same; which CPU and compiler options trained it decides that): its parameters shaken, each
    # by its own spread, with the first of a few seeds whose model the two searches tell apart.
    greedy = DecodeSettings(method="greedy", max_extra_length=CONTINUATION_TOKENS)
    beam_settings = DecodeSettings(method="beam", beam_size=4, max_extra_length=CONTINUATION_TOKENS)
    leaves, tree = jax.tree.flatten(params)
    apart = []
    for seed in range(8):
        keys = jax.random.split(jax.random.key(seed), len(leaves))
        shaken = jax.tree.unflatten(
            tree, [leaf + jnp.std(leaf) * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys)]
        )
        by_default = LanguageModel(config, shaken, tokenizer).complete(prompts)
        assert by_default == LanguageModel(config, shaken, tokenizer, greedy).complete(prompts), seed
        beam = LanguageModel(config, shaken, tokenizer, beam_settings).complete(prompts)
        apart.append(beam != by_default)
        if apart[-1]:
            break
    assert apart[-1], f"no seed of {len(apart)} gave a model whose greedy and beam continuations differ"


def test_a_prompt_is_kept_as_written(runs):
    """What sentencepiece normalises away (runs of spaces, NFKC's compatibility characters, a
    trailing space) or cannot spell (an emoji) stays in the printed prompt; the continuation is the
    one the normalised prompt gets (after a trailing space, one that starts a new word, as the
    normalised prompt's does here: test_language_model_prompts.py has a model where they differ)."""
    step, metadata, params = load_checkpoint(runs["multi30k_lm"])
    tokenizer = metadata.load_tokenizer()
    lm = LanguageModel(metadata.model_config(), params, tokenizer, DecodeSettings(method="greedy", max_extra_length=6))
    for prompt in ("Ein  Mann   mit", "Eine \ufb01 Frau \u2460", "Zwei Hunde \U0001f6b4 im", "Ein Kind "):
        normalised = tokenizer.decode(tokenizer.encode(prompt, add_eos=False))
        assert normalised != prompt  # the case is one sentencepiece rewrites
        completed, plain = lm.complete([prompt])[0], lm.complete([normalised])[0]
        assert completed.startswith(prompt) and plain.startswith(normalised)
        continuation = plain[len(normalised) :]
        assert continuation.strip(), prompt  # something was generated
        if prompt.endswith(" "):  # the prompt's own space separates the new word
            assert continuation.startswith(" "), continuation
            continuation = continuation[1:]
        assert completed == prompt + continuation, (prompt, completed, plain)
    prompts = ("Ein  Mann   mit", "Ein Kind ")
    # Any iterable of str, as Translator.translate takes, read once before the search; one str is refused.
    assert lm.complete(prompt for prompt in prompts) == lm.complete(list(prompts))
    with pytest.raises(TypeError, match="not one str"):
        lm.complete("Ein Mann")


@pytest.mark.slow  # to the slow set (about 16 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_generate_command(runs, tmp_path):
    workdir = runs["multi30k_lm"]
    (tmp_path / "prompts.txt").write_text("Ein Mann\n\nZwei Hunde spielen\nEin\u2028Kind\x0cmit\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "jaxformer.commands.generate", "--workdir", str(workdir), "--method", "beam"]
        + ["--max_new_tokens", "6", "--input", str(tmp_path / "prompts.txt")],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")[:-1]  # split at what the file was split at, not at U+2028
    assert len(lines) == 4 and lines[0].startswith("Ein Mann") and lines[2].startswith("Zwei Hunde spielen")
    assert lines[3].startswith("Ein\u2028Kind\x0cmit")  # a prompt is printed as written
    assert all(len(line.split()) > 1 for line in lines)  # something was added to every prompt

    # More tokens to sample among than the model has: refused before the parameters are read.
    too_many = subprocess.run(
        [sys.executable, "-m", "jaxformer.commands.generate", "--workdir", str(workdir), "--method", "sample"]
        + ["--top_k", "100000"],
        env=environment(),
        input="Ein Mann\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert too_many.returncode == 2 and too_many.stdout == "" and "loaded step" not in too_many.stderr
    assert too_many.stderr.strip().splitlines()[-1].startswith("error: top_k=100000 is more than the model's ")

    refused = subprocess.run(
        [sys.executable, "-m", "jaxformer.commands.generate", "--workdir", str(runs["multi30k_mlm"])],
        env=environment(),
        input="Ein Mann\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    last_line = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and "holds an encoder_only model" in last_line
    assert (
        "(a masked LM translates and continues nothing: start a translator's encoder from it with "
        "training.init_encoder_from)" in last_line
    )


def test_a_translator_refuses_a_language_model(runs):
    _, metadata, params = load_checkpoint(runs["multi30k_lm"])
    with pytest.raises(ConfigError, match="a Translator needs an encoder_decoder model, not 'decoder_only'"):
        Translator(metadata.model_config(), params, metadata.load_tokenizer())
    _, metadata, params = load_checkpoint(runs["multi30k_mlm"])
    with pytest.raises(ConfigError, match="not 'encoder_only' \\(a masked LM translates and continues nothing"):
        Translator(metadata.model_config(), params, metadata.load_tokenizer())


@pytest.mark.parametrize("command", ["evaluate", "translate"])
def test_translating_commands_refuse_a_language_model_run_before_reading_data_or_parameters(runs, command):
    workdir = runs["multi30k_lm"]
    flags = ["--split", "test_2016_flickr"] if command == "evaluate" else []
    result = subprocess.run(
        [sys.executable, "-m", f"jaxformer.commands.{command}", "--workdir", str(workdir), *flags],
        env=environment(),
        input="A man.\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {workdir} holds a decoder_only model; a Translator needs an encoder_decoder one "
        "(continue text with it through jaxformer-generate / LanguageModel)"
    )
    assert "loaded step" not in result.stderr and "pairs" not in result.stderr  # nothing read first


@pytest.mark.parametrize(
    ("name", "architecture", "missing", "built"),
    [("multi30k_lm", "decoder_only", "encoder", "decoder"), ("multi30k_mlm", "encoder_only", "decoder", "encoder")],
)
def test_the_depth_of_the_stack_a_language_model_lacks_is_named_unused(name, architecture, missing, built):
    """`--config multi30k_lm --config.model.num_encoder_layers=6` (a decoder_only model: no encoder)
    was ignored without a word; it is named in the run's `W unused:` line. The shipped configs keep
    the translator's two equal depths, and say nothing."""
    config = load_config(name)
    assert unused_settings(config) == []
    apply_overrides(config, [(f"model.num_{missing}_layers", "6")])
    assert unused_settings(config) == [
        f"model.num_{missing}_layers=6 (model.architecture is '{architecture}': no {missing} is built; "
        f"the {built}'s depth is model.num_{built}_layers=3)"
    ]


@pytest.mark.parametrize(
    ("name", "architecture", "unread", "reader"),
    [
        ("multi30k_lm", "decoder_only", "source", "a causal LM reads data.target_language"),
        ("multi30k_mlm", "encoder_only", "target", "a masked LM reads data.source_language"),
    ],
)
def test_the_language_of_the_side_a_language_model_does_not_read_is_named_unused(name, architecture, unread, reader):
    """`--config multi30k_lm --config.data.source_language=fr` (a causal LM models the target side's
    text; the masked LM so of target_language) was kept without a word, as the unbuilt stack's depth
    was; it is named in the run's `W unused:` line. The language read, and the shipped configs'
    defaults, say nothing."""
    config = load_config(name)
    assert unused_settings(config) == []
    apply_overrides(config, [(f"data.{unread}_language", "fr")])
    assert unused_settings(config) == [
        f"data.{unread}_language='fr' (model.architecture is '{architecture}': {reader}'s text alone)"
    ]
    read = "target" if unread == "source" else "source"
    apply_overrides(
        config, [(f"data.{unread}_language", "en" if unread == "source" else "de"), (f"data.{read}_language", "fr")]
    )
    assert unused_settings(config) == []


@pytest.mark.parametrize(("name", "architecture"), [("multi30k_lm", "decoder_only"), ("multi30k_mlm", "encoder_only")])
def test_a_language_models_test_file_is_named_unused(name, architecture):
    """data.files.test beside a language model's own files was read and prepared without a word,
    though nothing scores a language model on it (jaxformer-evaluate refuses one): the user, told
    nothing, would wait for a test score. A translator's test file says nothing."""
    config = load_config(name)
    apply_overrides(config, [("data.name", "parallel_files"), ("data.files.train", "/c/train.{lang}")])
    assert unused_settings(config) == []
    apply_overrides(config, [("data.files.test", "/c/test.tsv")])
    assert unused_settings(config) == [
        f"data.files.test='/c/test.tsv' (model.architecture is '{architecture}': nothing scores a language model "
        "on a test split; jaxformer-evaluate scores translators)"
    ]
    apply_overrides(config, [("model.architecture", "encoder_decoder")])
    assert unused_settings(config) == []


def test_an_unused_value_holding_a_bracket_and_an_equals_sign_is_read_back_whole():
    """unused_keys read each key and its reason back out of unused_settings' text (split at the
    first "=" and the first " ("): a value holding " (" gave its tail as the reason. Both now come
    from one list of (key, value, why) records; the text said is the same."""
    config = load_config("multi30k_lm")
    apply_overrides(config, [("data.source_language", "fr (a=b)")])
    why = "model.architecture is 'decoder_only': a causal LM reads data.target_language's text alone"
    assert unused_settings(config) == [f"data.source_language='fr (a=b)' ({why})"]
    assert unused_keys(config)["data.source_language"] == why
