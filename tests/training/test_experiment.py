import importlib.util
import pathlib

import pytest

from jaxformer.model.config import ConfigError, preset
from jaxformer.training import config_file, experiment, text_sides
from jaxformer.training.config_paths import with_absolute_paths

CONFIG_DIR = pathlib.Path(__file__).parents[2] / "jaxformer" / "configs"


def load(name):
    spec = importlib.util.spec_from_file_location(name, CONFIG_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("name", sorted(path.stem for path in CONFIG_DIR.glob("*.py") if not path.stem.startswith("_")))
def test_every_config_file_validates(name):
    config = load(name)
    experiment.validate(config)
    model = experiment.model_config(config, config.tokenizer.vocab_size)
    assert model.vocab_size == config.tokenizer.vocab_size


def test_paper_configs():
    for name, d_model, dropout in (("wmt14_base", 512, 0.1), ("wmt14_big", 1024, 0.3)):
        config = load(name)
        model = experiment.model_config(config, config.tokenizer.vocab_size)
        assert model == preset(name.split("_")[1], vocab_size=37_000, dropout_rate=dropout)
        assert (model.d_model, model.dropout_rate, model.num_encoder_layers) == (d_model, dropout, 6)
        assert config.data.name == "wmt14_translate/de-en"
        assert 24_000 <= config.data.batch_size * config.data.max_length * 0.9 <= 30_000  # ~25k target tokens
        assert (config.optimizer.b1, config.optimizer.b2, config.optimizer.eps) == (0.9, 0.98, 1e-9)
        assert config.optimizer.warmup_steps == 4000 and config.training.label_smoothing == 0.1


def test_unknown_keys_list_near_matches():
    config = load("tiny")
    config.training.num_train_step = 5
    with pytest.raises(
        ConfigError, match=r"unknown config key 'training.num_train_step'; did you mean training.num_train_steps"
    ):
        experiment.validate(config)
    config = load("tiny")
    config.model.num_head = 2  # named as the config names it, as the other keys are (was "unknown key 'num_head'")
    with pytest.raises(ConfigError, match=r"^unknown config key 'model.num_head'; did you mean model.num_heads"):
        experiment.validate(config)


@pytest.mark.parametrize(
    ("key", "section", "first"),
    [
        ("training.datas", "training", "training.seed"),  # a section's name where a key was typed
        ("model.decoding", "decoding", "model.d_model"),
        ("model.trainin", "training", "model.activation"),
        ("data.file", "data.files", "data.name"),  # a nested section's
        ("trainig", "training", None),  # no value is set at the top
        ("trainig.seed", "training", "training.seed"),  # the section where a section was typed
        ("data.file.train", "data.files", "data.files.train"),
    ],
)
def test_an_unknown_key_is_offered_only_keys_that_can_stand_in_its_place(key, section, first):
    """A typed key sets a value: its near matches are keys of values with as many parts, never a
    section's name (`--config.training.datas=...` was offered `training`, `model.decoding` `decoding`)."""
    with pytest.raises(ConfigError) as raised:
        config_file.apply_overrides(experiment.default_config(), [(key, "1")])
    message = str(raised.value)
    offered = message.partition("; did you mean ")[2].removesuffix("?").split(", ") if "did you mean" in message else []
    assert section not in offered, message
    assert all(name.count(".") == key.count(".") for name in offered), message
    assert (offered[0] if offered else None) == first, message


def test_describe_lists_only_what_differs_from_the_defaults():
    config = load("tiny")
    text = experiment.describe(config)
    assert text.startswith("config: model preset 'tiny'; changed from the defaults: ")
    assert "training.num_train_steps=40" in text and "data.batch_size=4" in text
    assert "optimizer.b1" not in text and "model.d_model" not in text and "\n" not in text
    config.model.num_heads = 2
    config.mesh.shape = (2, 1, 1)
    text = experiment.describe(config)
    assert "model.num_heads=2" in text and "mesh.shape=(2, 1, 1)" in text
    assert experiment.describe(experiment.default_config()).endswith("changed from the defaults: nothing")


def test_parallel_files_keys_are_checked_before_anything_runs():
    config = experiment.default_config()
    config.data.name = "parallel_files"
    with pytest.raises(
        ConfigError, match=r"needs data.files.train: .*, e.g. --config.data.files.train='corpus/train"
    ) as raised:
        experiment.validate(config)
    assert "text file" not in str(raised.value)  # a translator reads pairs
    config.model.architecture = "decoder_only"  # a language model reads one side: a text file will do
    with pytest.raises(ConfigError, match=r"\{lang\}.gz', or a text file of one sentence per line$"):
        experiment.validate(config)
    config = experiment.default_config()
    config.data.files.test = "test.tsv"
    with pytest.raises(ConfigError, match=r"data.files.test='test.tsv' applies to data.name='parallel_files' only"):
        experiment.validate(config)


def test_seeds_beyond_what_jit_and_grain_take_are_refused_as_the_config_is_validated():
    import grain
    import jax

    # Why: the loop passes training.seed to jitted functions, which take a Python int as an int32,
    # and data.shuffle_seed to grain's shuffle, which takes 32-bit seeds; both failed once the run had started.
    jax.jit(jax.random.PRNGKey)(2**31 - 1)
    with pytest.raises(OverflowError):
        jax.jit(jax.random.PRNGKey)(2**31)
    grain.MapDataset.range(3).shuffle(seed=2**32 - 1)
    with pytest.raises(ValueError, match=r"Seed must be an integer between 0 and 2\*\*32-1"):
        grain.MapDataset.range(3).shuffle(seed=2**32)
    for key, largest in (("training.seed", 2**31 - 1), ("data.shuffle_seed", 2**32 - 1)):
        section, name = key.split(".")
        config = load("tiny")
        config[section][name] = largest
        experiment.validate(config)
        for seed in (largest + 1, 2**64, -1):
            config[section][name] = seed
            with pytest.raises(ConfigError) as refused:
                experiment.validate(config)
            assert str(refused.value) == f"config {key}={seed}: must be an integer from 0 to {largest}"


def test_paths_a_run_stores_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = experiment.default_config()
    config.data.name = "parallel_files"
    config.data.files.train = "corpus/train.{lang}.gz"
    config.training.init_from = "runs/base"
    config.data.data_dir = "tfds"  # a later command run from elsewhere reads the same prepared data
    config.data.raw_dir = "gs://bucket/multi30k"  # not a local path: kept
    absolute = with_absolute_paths(config)
    assert absolute.data.data_dir == str(tmp_path / "tfds") and absolute.data.raw_dir == "gs://bucket/multi30k"
    assert absolute.data.files.train == str(tmp_path / "corpus" / "train.{lang}.gz")
    assert absolute.training.init_from == str(tmp_path / "runs" / "base")
    assert absolute.data.files.validation is None and absolute.tokenizer.model_path is None
    assert config.data.files.train == "corpus/train.{lang}.gz"  # the caller's config is left as it was

    # "link/../tok" is the "tok" beside the link's target, as the system opens it, not "./tok".
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "sub")
    config.tokenizer.model_path = "link/../tok/same.model"
    config.data.files.train = "corpus/../corpus/train.{lang}.gz"
    absolute = with_absolute_paths(config)
    assert absolute.tokenizer.model_path == str(tmp_path / "elsewhere" / "tok" / "same.model")
    assert absolute.data.files.train == str(tmp_path / "corpus" / "train.{lang}.gz")
    # A file that is a link keeps its name (a .tsv linked to a git-annex or hub blob is still a TSV).
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "5f3a").write_text("a\tb\n")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.tsv").symlink_to(tmp_path / "blobs" / "5f3a")
    config.data.files.train = "corpus/train.tsv"
    config.training.init_from = "runs/base/"
    absolute = with_absolute_paths(config)
    assert absolute.data.files.train == str(tmp_path / "corpus" / "train.tsv")
    assert absolute.training.init_from == str(tmp_path / "runs" / "base")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"model.architecture": "decoder_only", "tokenizer.separate_vocabularies": True},
            "tokenizer.separate_vocabularies=True applies to translation \\(model.architecture='encoder_decoder'\\), "
            "not to model.architecture='decoder_only'$",
        ),
        (
            {
                "model.architecture": "encoder_only",
                "tokenizer.separate_vocabularies": False,
                "training.bleu_every_steps": 100,
            },
            "training.bleu_every_steps=100 applies to translation \\(model.architecture='encoder_decoder'\\), "
            "not to model.architecture='encoder_only'$",
        ),
        (
            {"training.init_from": "/runs/a", "training.init_encoder_from": "/runs/b"},
            "both set: a run starts from a whole model or from pretrained halves",
        ),
        (
            {
                "model.architecture": "decoder_only",
                "tokenizer.separate_vocabularies": False,
                "training.bleu_every_steps": 0,
                "training.final_choice": False,
                "training.init_decoder_from": "/b",
            },
            "starts a translator",
        ),
        ({"model.architecture": "encoder_and_decoder"}, "model.architecture='encoder_and_decoder': must be one of"),
        # a config file's own preset name: was "unknown preset 'huge'; ...", naming no key
        ({"model.preset": "huge"}, r"^config model\.preset='huge': must be one of 'tiny', 'base', 'big'$"),
        (  # an imported MarianMT model has max_position_embeddings positions; multi30k's rows are 64 long
            {"model.max_positions": 48},
            r"^config data.max_length=64 with model.max_positions=48: rows that long reach positions the model "
            "lacks; lower data.max_length to at most 48$",
        ),
        ({"model.max_positions": 64}, None),  # positions 0 to 63: the rows fit
    ],
)
def test_config_options_that_contradict_are_errors(changes, message):
    config = load("multi30k")
    for key, value in changes.items():
        section, name = key.split(".")
        config[section][name] = value
    if message is None:
        experiment.validate(config)
        return
    with pytest.raises(ConfigError, match=message):
        experiment.validate(config)


@pytest.mark.parametrize(("name", "architecture"), [("multi30k_lm", "decoder_only"), ("multi30k_mlm", "encoder_only")])
def test_a_language_models_moving_average_is_refused(name, architecture):
    """optimizer.ema_decay keeps a moving average of the parameters whose one reader is the final
    choice (its candidate ema), which a language model's run is refused: it was updated at every
    step and checkpointed, never read, and nothing said so."""
    config = load(name)
    config.optimizer.ema_decay = 0.998
    with pytest.raises(
        ConfigError,
        match=rf"^config optimizer\.ema_decay=0\.998: the moving average is read only by the final choice "
        rf"\(its candidate 'ema'\), which a run with model.architecture='{architecture}' never makes; use 0$",
    ):
        experiment.validate(config)
    config.optimizer.ema_decay = 0.0
    experiment.validate(config)


def test_a_bleu_tokenizer_is_one_of_sacrebleus_and_built_before_a_run_that_scores_bleu(monkeypatch):
    """ja-mecab without MeCab (the ja extra) would stop the run at its first validation BLEU."""
    monkeypatch.setattr("sacrebleu.tokenizers.tokenizer_ja_mecab.MeCab", None)
    config = load("multi30k")
    config.data.target_language = "ja"
    with pytest.raises(
        ConfigError,
        match=r"^config training.bleu_tokenize=None: BLEU of target language 'ja' is scored with sacreBLEU's "
        r"'ja-mecab' tokenizer, which cannot be built here \(RuntimeError: [^\n]*\): install it with pip install "
        r"'jaxformer\[ja\]', or name another tokenizer with --config.training.bleu_tokenize \(e.g. 'char'\)$",
    ):
        experiment.validate(config)
    config.training.bleu_tokenize = "char"  # needs nothing
    experiment.validate(config)
    config.training.bleu_tokenize = None
    config.training.bleu_every_steps, config.training.final_choice = 0, False  # nothing scored while training
    experiment.validate(config)
    config.training.bleu_tokenize = "mecab"
    with pytest.raises(ConfigError, match=r"^config training.bleu_tokenize='mecab': must be None \(sacreBLEU's "):
        experiment.validate(config)


@pytest.mark.parametrize("time_budget_minutes", [0.0, 1.0])
def test_a_budget_schedule_capped_within_its_warmup_is_refused_with_or_without_a_time_budget(time_budget_minutes):
    """A time budget ends the run at num_train_steps at the latest: it trained only warmup steps."""
    config = load("multi30k")
    config.training.time_budget_minutes, config.training.num_train_steps = time_budget_minutes, 5
    config.optimizer.warmup_steps = 10
    with pytest.raises(
        ConfigError,
        match=r"^config training.num_train_steps=5 ends within optimizer.warmup_steps=10: the budget schedule would "
        "never decay; lower warmup_steps$",
    ):
        experiment.validate(config)


def test_language_models_read_one_side_and_translators_both():
    assert text_sides.text_languages(load("multi30k_mlm")) == ("en",)
    assert text_sides.text_languages(load("multi30k_lm")) == ("de",)
    assert text_sides.text_languages(load("multi30k")) == ("en", "de")
    assert text_sides.control_symbols(load("multi30k_mlm")) == ("<mask>",)
    assert text_sides.control_symbols(load("multi30k_lm")) == ()


@pytest.mark.parametrize("name", ["multi30k_lm", "multi30k_mlm"])
def test_a_language_models_one_vocabulary_is_tokenizer_model_path(name):
    config = load(name)
    config.tokenizer.target_model_path = "/models/de.model"
    with pytest.raises(
        ConfigError,
        match=r"target_model_path='/models/de.model': a language model \(model.architecture='(de|en)coder_only'\) "
        r"has one vocabulary; give it as tokenizer.model_path$",
    ):
        experiment.validate(config)


def test_a_preset_override_sets_the_presets_sizes_before_the_other_overrides():
    from jaxformer.model.config import PRESETS
    from jaxformer.training.config_file import apply_overrides, load_config

    config = load_config("tiny")
    apply_overrides(config, [("model.d_model", "64"), ("model.preset", "big")])  # the preset first, whatever its place
    model = experiment.model_config(config, 1000)
    big = PRESETS["big"]
    assert (model.d_model, model.num_heads, model.d_ff) == (64, big["num_heads"], big["d_ff"])
    assert (model.num_encoder_layers, model.dropout_rate) == (big["num_encoder_layers"], big["dropout_rate"])
    assert model.vocab_size == 1000  # the tokenizer's, not the preset's
    with pytest.raises(ConfigError, match=r"^--config.model.preset=huge: must be one of tiny, base, big$"):
        apply_overrides(config, [("model.preset", "huge")])


def test_settings_of_a_feature_switched_off_are_kept_and_named():
    from jaxformer.training.unused_settings import unused_settings

    config = load("multi30k")  # its final choice compares length penalties
    assert unused_settings(config) == []
    config.training.final_choice = False  # switched off from the command line: still valid
    config.training.rdrop_decision_step = 5
    experiment.validate(config)
    assert unused_settings(config) == [
        "training.final_alphas=(1.0, 1.4, 1.8, 2.2) (training.final_choice is False)",
        "training.rdrop_decision_step=5 (training.rdrop_min_plain_steps is 0)",
    ]
    config.training.final_choice, config.decoding.method = True, "greedy"  # the final choice compares no alpha
    assert unused_settings(config)[0] == (
        "training.final_alphas=(1.0, 1.4, 1.8, 2.2) (decoding.method is 'greedy': a length penalty ranks beam "
        "search's hypotheses only)"
    )


@pytest.mark.parametrize(
    "name, key, architecture",
    [
        ("multi30k_lm", "init_encoder_from", "decoder_only"),
        ("multi30k_mlm", "init_decoder_from", "encoder_only"),
    ],
)
def test_a_language_model_started_from_a_translators_part_names_its_architecture_key(name, key, architecture):
    from jaxformer.training.config_file import load_config

    config = load_config(name)
    config.training[key] = "/runs/part"
    with pytest.raises(
        ConfigError,
        match=rf"starts a translator \(model.architecture='encoder_decoder'\), "
        rf"not model.architecture='{architecture}'$",
    ):
        experiment.validate(config)


def test_the_length_penalty_form_of_translating_during_training_is_a_config_key():
    from jaxformer.training.config_file import apply_overrides
    from jaxformer.training.validation_bleu import decode_settings

    config = load("multi30k")
    assert config.decoding.length_penalty is None  # the run's start settles it (run_start.settle_length_penalty)
    assert decode_settings(config).length_penalty == "gnmt"
    apply_overrides(config, [("decoding.length_penalty", "transformers")])
    experiment.validate(config)
    assert decode_settings(config).length_penalty == "transformers"  # validation BLEU and the final choice
    apply_overrides(config, [("decoding.length_penalty", "marian")])
    with pytest.raises(ConfigError) as error:
        experiment.validate(config)
    assert str(error.value) == (
        "config decoding.length_penalty='marian': must be None (training.init_from's form, else 'gnmt') or one of "
        "'gnmt', 'transformers'"
    )


def test_renormalizing_after_the_bans_is_a_decoding_key_of_true_or_false():
    import ml_collections

    from jaxformer.training.config_file import apply_overrides
    from jaxformer.training.validation_bleu import decode_settings

    config = load("multi30k")
    assert config.decoding.renormalize_after_bans is None  # the run's start settles it
    assert decode_settings(config).renormalize_after_bans is False
    apply_overrides(config, [("decoding.renormalize_after_bans", "true")])
    experiment.validate(config)
    assert decode_settings(config).renormalize_after_bans is True  # validation BLEU and the final choice
    with pytest.raises(ConfigError) as error:
        apply_overrides(config, [("decoding.renormalize_after_bans", "maybe")])
    assert str(error.value) == (  # was "must be True or False", naming none of the texts it takes
        "--config.decoding.renormalize_after_bans=maybe: must be True, False or None "
        "(true, yes or 1; false, no or 0; in any case)"
    )
    with pytest.raises(ConfigError) as error:
        apply_overrides(config, [("data.download", " Maybe ")])
    assert (
        str(error.value)
        == "--config.data.download= Maybe : must be True or False (true, yes or 1; false, no or 0; in any case)"
    )
    for text, value in ((" YES ", True), ("No", False), ("1", True), ("FALSE", False)):
        apply_overrides(config, [("data.download", text)])
        assert config.data.download is value
    for value in ("yes", 1):  # as a config file or a saved run's JSON can hold it
        config.decoding = ml_collections.ConfigDict({**config.decoding.to_dict(), "renormalize_after_bans": value})
        with pytest.raises(ConfigError) as error:
            experiment.validate(config)
        assert str(error.value) == (
            f"config decoding.renormalize_after_bans={value!r}: must be None (training.init_from's, else False), "
            "True or False"
        )
