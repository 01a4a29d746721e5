"""tokenizer.* keys that a run with given tokenizers cannot use: tokenizer.vocab_size with every
vocabulary given (one rule, one message), and the options of training a tokenizer when none is
trained (named at start by unused_settings)."""

import io

import pytest
import sentencepiece as spm

from jaxformer.model.config import ConfigError
from jaxformer.training import experiment
from jaxformer.training.config_file import load_config
from jaxformer.training.unused_settings import unused_settings
from tests.conftest import read_raw


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Sentencepiece models trained elsewhere (sentencepiece's default ids): 81, 61 and 81 pieces
    once converted (a <pad> piece added)."""
    directory = tmp_path_factory.mktemp("models")
    paths = {}
    for name, language, size in (("en", "en", 80), ("de", "de", 60), ("de81", "de", 80)):
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(read_raw(f"train.{language}.gz", 500)),
            model_writer=model,
            vocab_size=size,
            minloglevel=2,
        )
        paths[name] = directory / f"{name}.model"
        paths[name].write_bytes(model.getvalue())
    return paths


def separate(models, target="de", vocab_size=None):
    config = load_config("multi30k")  # separate vocabularies, tokenizer.vocab_size 6000
    config.tokenizer.model_path, config.tokenizer.target_model_path = str(models["en"]), str(models[target])
    if vocab_size is not None:
        config.tokenizer.vocab_size = vocab_size
    return config


@pytest.mark.parametrize("vocab_size", [6000, 81, 61, 100])
def test_two_given_models_of_two_sizes_take_the_default_vocab_size_only(models, vocab_size):
    with pytest.raises(ConfigError) as raised:
        experiment.validate(separate(models, vocab_size=vocab_size))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"config tokenizer.vocab_size={vocab_size}, but ")
    assert (
        f"tokenizer.model_path {models['en']} has 80 pieces, 81 with jaxformer's special piece <pad> added" in message
    )
    assert (
        f"tokenizer.target_model_path {models['de']} has 60 pieces, 61 with jaxformer's special piece <pad>" in message
    )
    # One advice, the same whichever size was set: 81 and 61 no longer send the user to each other.
    assert "set tokenizer.vocab_size=8000 (default_config()'s value" in message
    assert "one value cannot be both sizes" in message and "vocab_size=81" not in message.split("set ")[1]
    assert "multi30k's 6000, counts as a choice" in message  # not "its default", which multi30k's is not


def test_two_given_models_with_the_default_vocab_size_keep_their_sizes(models):
    config = separate(models, vocab_size=experiment.DEFAULT_VOCAB_SIZE)
    experiment.validate(config)
    assert experiment.vocabulary_sizes(config) == (81, 61)


def test_two_given_models_of_one_size_also_take_that_size(models):
    assert experiment.vocabulary_sizes(separate(models, "de81", vocab_size=81)) == (81, 81)
    with pytest.raises(ConfigError) as raised:
        experiment.validate(separate(models, "de81"))
    assert "set tokenizer.vocab_size=81, or 8000 (default_config()'s value" in str(raised.value)
    assert "both sizes" not in str(raised.value)


def test_a_side_that_a_fine_tuning_start_gives_holds_vocab_size_to_nothing(models):
    """The start's tokenizer replaces tokenizer.vocab_size (logged): a model given for that side is
    only checked against it, so its size cannot contradict vocab_size."""
    config = load_config("tiny")  # one shared vocabulary of 1000 pieces
    config.tokenizer.model_path = str(models["en"])  # 81 pieces
    config.training.init_from = "/runs/base"
    experiment.validate(config)
    assert experiment.vocabulary_sizes(config) == (81, 81)
    # Separate vocabularies: the encoder's start gives the source side; the target's model still
    # holds vocab_size to its size.
    config = separate(models)
    config.training.init_encoder_from = "/runs/mlm"
    with pytest.raises(ConfigError) as raised:
        experiment.validate(config)
    assert f"tokenizer.target_model_path {models['de']} has 60 pieces, 61 with" in str(raised.value)
    assert "tokenizer.model_path" not in str(raised.value).split(", but ")[1]
    config.tokenizer.vocab_size = 61
    experiment.validate(config)
    config.training.init_encoder_from, config.training.init_from = None, "/runs/base"
    config.tokenizer.vocab_size = 6000  # both sides from the start
    experiment.validate(config)


def test_a_given_shared_model_names_its_size_and_the_default(models):
    config = load_config("tiny")  # one shared vocabulary of 1000 pieces
    config.tokenizer.model_path = str(models["en"])
    with pytest.raises(ConfigError) as raised:
        experiment.validate(config)
    message = str(raised.value)
    assert message.startswith(
        f"config tokenizer.vocab_size=1000, but tokenizer.model_path {models['en']} has 80 pieces, 81 with "
        "jaxformer's special piece <pad> added, and no vocabulary is trained here: "
    )
    assert "set tokenizer.vocab_size=81, or 8000 (" in message
    config.tokenizer.vocab_size = 81
    experiment.validate(config)


def test_a_masked_lm_names_the_given_models_own_size_and_the_mask_piece_it_adds(models, tmp_path):
    """A model with jaxformer's ids (a workdir's tokenizer.model) has all its special pieces: the
    masked LM adds only its <mask> piece, and the message counts the file's pieces, then that one."""
    from jaxformer.data.tokenizer import with_jaxformer_ids

    converted = tmp_path / "tokenizer.model"
    converted.write_bytes(with_jaxformer_ids(models["en"].read_bytes()))  # 81 pieces, <pad> included
    config = load_config("multi30k_mlm")
    config.tokenizer.model_path, config.tokenizer.vocab_size = str(converted), 81
    with pytest.raises(ConfigError) as raised:
        experiment.validate(config)
    assert str(raised.value).startswith(
        f"config tokenizer.vocab_size=81, but tokenizer.model_path {converted} has 81 pieces, 82 with the masked "
        "LM's <mask> piece added, and no vocabulary is trained here: set tokenizer.vocab_size=82, or 8000 ("
    )
    config.tokenizer.model_path = str(models["en"])  # sentencepiece's own ids: no <pad> either
    with pytest.raises(ConfigError, match="has 80 pieces, 82 with jaxformer's special piece <pad> and the masked LM's"):
        experiment.validate(config)
    config.tokenizer.vocab_size = 82
    experiment.validate(config)


# -- options of training a tokenizer, when none is trained -----------------------------------------

TRAINING_OPTIONS = {"model_type": "bpe", "character_coverage": 0.9995, "max_sentences": 1000}
NAMED = [
    "tokenizer.model_type='bpe'",
    "tokenizer.character_coverage=0.9995",
    "tokenizer.max_sentences=1000",
]


def with_options(config, **values):
    config.tokenizer.update({**TRAINING_OPTIONS, **values})
    return config


def test_a_given_model_under_home_is_read_as_the_run_reads_it(models, monkeypatch):
    """tokenizer.model_path / target_model_path under "~" are read as the run reads its paths
    (config_paths): validation, which reads the models first, must not call them missing."""
    monkeypatch.setenv("HOME", str(models["en"].parent))
    config = separate(models, vocab_size=experiment.DEFAULT_VOCAB_SIZE)
    config.tokenizer.model_path, config.tokenizer.target_model_path = "~/en.model", "~/de.model"
    experiment.validate(config)
    assert experiment.vocabulary_sizes(config) == (81, 61)


def test_a_tokenizer_trained_here_uses_its_options():
    assert unused_settings(with_options(load_config("tiny"))) == []
    config = with_options(load_config("multi30k"), model_path="/models/en.model")
    assert unused_settings(config) == []  # the target's vocabulary is trained with them
    config = with_options(load_config("multi30k"), target_model_path="/models/de.model")
    assert unused_settings(config) == []
    composed = with_options(load_config("multi30k"))
    composed.training.init_encoder_from = "/runs/mlm"  # the decoder's side is trained here
    assert unused_settings(composed) == []


def changed(config, change):
    """`config` with the {"section.key": value} of `change` set."""
    for key, value in change.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"tokenizer.model_path": "/models/joint.model"}, "tokenizer.model_path gives the vocabulary"),
        ({"training.init_from": "/runs/base"}, "training.init_from gives the vocabulary"),
        # a given model is only checked against the start's tokenizer, which the run uses
        (
            {"training.init_from": "/runs/base", "tokenizer.model_path": "/models/joint.model"},
            "training.init_from gives the vocabulary",
        ),
    ],
)
def test_a_given_shared_vocabulary_names_the_training_options_as_unused(change, reason):
    config = changed(with_options(load_config("tiny")), change)
    assert unused_settings(config) == [f"{option} (no tokenizer is trained: {reason})" for option in NAMED]


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            {"tokenizer.model_path": "/models/en.model", "tokenizer.target_model_path": "/models/de.model"},
            "tokenizer.model_path gives the source vocabulary, tokenizer.target_model_path the target's",
        ),
        ({"training.init_from": "/runs/base"}, "training.init_from gives both vocabularies"),
        (
            {"training.init_encoder_from": "/runs/mlm", "training.init_decoder_from": "/runs/lm"},
            "training.init_encoder_from gives the source vocabulary, training.init_decoder_from the target's",
        ),
    ],
)
def test_given_separate_vocabularies_name_the_training_options_as_unused(change, reason):
    config = changed(with_options(load_config("multi30k")), change)
    assert unused_settings(config) == [f"{option} (no tokenizer is trained: {reason})" for option in NAMED]


def test_a_resumed_run_names_no_tokenizer_option():
    """The workdir's checkpoint gives a resumed run its tokenizers, made with these options at its
    start (a changed one is refused): whatever init_from or model_path says, none is 'unused'."""
    config = changed(with_options(load_config("tiny")), {"training.init_from": "/runs/base"})
    assert unused_settings(config) != [] and unused_settings(config, resuming=True) == []
    config.training.rdrop_decision_step = 700  # other unused settings are still named
    assert unused_settings(config, resuming=True) == [
        "training.rdrop_decision_step=700 (training.rdrop_min_plain_steps is 0)"
    ]


def test_only_options_that_differ_from_the_defaults_are_named():
    config = experiment.default_config()
    config.tokenizer.model_path = "/models/joint.model"
    assert unused_settings(config) == []  # default_config's model_type, coverage and sample: nothing said
    tiny = load_config("tiny")  # its own sample size, 4000 sentences
    tiny.tokenizer.model_path = "/models/joint.model"
    assert unused_settings(tiny) == [
        "tokenizer.max_sentences=4000 (no tokenizer is trained: tokenizer.model_path gives the vocabulary)"
    ]


@pytest.mark.parametrize("name", ["multi30k_lm", "multi30k_mlm"])
def test_a_language_model_names_the_translation_settings_it_never_reads(name):
    architecture = load_config(name).model.architecture
    config = changed(
        load_config(name),
        {
            "decoding.beam_size": 8,
            "decoding.method": "sample",
            "training.bleu_examples": 100,
            "training.average_last": 2,
        },
    )
    why = f"model.architecture is {architecture!r}: nothing is translated during training"
    assert unused_settings(config) == [
        f"decoding.beam_size=8 ({why})",
        f"decoding.method='sample' ({why})",
        f"training.bleu_examples=100 ({why})",
        f"training.average_last=2 ({why})",
    ]


def test_a_translator_names_the_validation_bleu_and_final_choice_settings_it_never_reads():
    config = changed(load_config("multi30k"), {"training.bleu_examples": 100, "decoding.beam_size": 6})
    assert unused_settings(config) == []  # validation BLEU and the final choice read them
    config = changed(config, {"training.bleu_every_steps": 0})
    assert unused_settings(config) == [
        "training.bleu_examples=100 (training.bleu_every_steps is 0)",
        "training.bleu_method='greedy' (training.bleu_every_steps is 0)",
    ]
    config = changed(config, {"training.final_choice": False, "training.final_alphas": (), "training.average_last": 3})
    nothing = "training.bleu_every_steps is 0 and training.final_choice is False: nothing is translated"
    assert unused_settings(config) == [
        "training.bleu_examples=100 (training.bleu_every_steps is 0)",
        "training.bleu_method='greedy' (training.bleu_every_steps is 0)",
        "training.average_last=3 (training.final_choice is False)",
        f"decoding.beam_size=6 ({nothing})",
    ]


def test_a_holdout_that_nothing_holds_out_is_named():
    config = changed(load_config("multi30k"), {"data.validation_holdout": 77})
    assert unused_settings(config) == [
        "data.validation_holdout=77 (data.name is 'multi30k', whose validation split is its own; "
        "only parallel_files holds pairs out)"
    ]
    config = changed(load_config("parallel_files"), {"data.validation_holdout": 77})
    config.data.files.train = "t.tsv"
    assert unused_settings(config) == []  # held out of t.tsv
    config.data.files.validation = "dev.tsv"
    assert unused_settings(config) == [
        "data.validation_holdout=77 (data.files.validation is given: no pairs are held out)"
    ]


def test_a_start_checkpoint_without_a_start_is_named():
    """training.init_checkpoint alone (its init_from forgotten) trained from random values without a word."""
    config = changed(load_config("multi30k"), {"training.init_checkpoint": "best"})
    assert unused_settings(config) == [
        "training.init_checkpoint='best' (no training.init_from, init_encoder_from or init_decoder_from: the run "
        "starts from random values)"
    ]
    config.training.init_from = "runs/base"
    assert unused_settings(config) == []


def test_a_resumes_given_model_that_changed_size_is_named_changed_not_sent_to_another_vocab_size(models, tmp_path):
    """A run started with tokenizer.model_path (81 pieces converted, vocab_size=81) resumed after the
    file was replaced by a 61-piece model: "set tokenizer.vocab_size=61" would be refused as another
    configuration than the run's, so the workdir's copy names the file as changed, with the remedies."""
    from jaxformer.data.tokenizer import Tokenizer

    given = tmp_path / "my_spm.model"
    given.write_bytes(models["en"].read_bytes())
    workdir = tmp_path / "run"
    workdir.mkdir()
    Tokenizer.from_sentencepiece_file(given).save(workdir / "tokenizer.model")  # what the run's start wrote
    config = load_config("tiny")
    config.tokenizer.model_path, config.tokenizer.vocab_size = str(given), 81
    experiment.validate(config, workdir)  # the file as the run had it
    given.write_bytes(models["de"].read_bytes())  # replaced since
    with pytest.raises(ConfigError) as raised:
        experiment.validate(config, workdir)
    assert str(raised.value) == (
        f"tokenizer.model_path {given} converts to 61 pieces, but {workdir / 'tokenizer.model'}, the workdir's "
        "conversion of the model its run started with, has 81 (tokenizer.vocab_size=81, as the run was trained): "
        "the file changed since, or it is another model; restore that file, or leave tokenizer.model_path unset "
        "to resume with the workdir's copy, or use a new workdir"
    )
    # A new run (no workdir, or one without that tokenizer) is told the value to set, as before.
    for new_run in (None, tmp_path / "new"):
        with pytest.raises(
            ConfigError, match=r"^config tokenizer\.vocab_size=81, but .* set tokenizer\.vocab_size=61, or 8000"
        ):
            experiment.validate(config, new_run)
