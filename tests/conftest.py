"""Test settings: 8 simulated CPU devices and strict numerics, set before jax is imported."""

import os
import pathlib

from tests.xla_flags import FAST_COMPILES

# Eight simulated devices, and the fast compiles every test process uses (tests/xla_flags.py) unless
# XLA_FLAGS already chooses those options.
_flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in flag]
_flags.append("--xla_force_host_platform_device_count=8")
_flags += [option for option in FAST_COMPILES if not any(option.split("=")[0] in flag for flag in _flags)]
os.environ["XLA_FLAGS"] = " ".join(_flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole run: pytest workers and the train.py
# subprocesses the tests start compile the same tiny programs many times over. Every program is
# kept, single eager operations too: reading one back took about a quarter of compiling it (11
# against 40 ms at level 0; docs/test_suite.md), and the two workers and each subprocess compile
# the same few thousand of them.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).parents[1] / ".pytest_cache" / "jax_compilation_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402

# Shape checks: every jaxtyping annotation in the model and decoding packages is enforced
# (beartype at each call), so a wrong "B T D" fails the test that passes it.
from jaxtyping import install_import_hook  # noqa: E402

_CHECKED = [
    "attention",
    "cache",
    "decoder",
    "decoder_only",
    "dropout",
    "encoder",
    "encoder_only",
    "layers",
    "masking",
    "position",
    "transformer",
]
if os.environ.get("JAXFORMER_SHAPE_CHECKS", "1") != "0":  # 0: off, to measure what the checks cost
    install_import_hook(
        [f"jaxformer.model.{name}" for name in _CHECKED] + ["jaxformer.decoding"], "beartype.beartype"
    )  # not model.config: its tests pass wrong types on purpose, to see ConfigError

# Silent rank promotion hides shape bugs; make it an error in tests.
jax.config.update("jax_numpy_rank_promotion", "raise")


import logging  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The root logger's level before any test: what each test leaves it at.
_ROOT_LEVEL = logging.getLogger().level


@pytest.fixture(autouse=True)
def _root_log_level_restored():
    """A command run in-process (train.main sets INFO) sets the root logger's level as its process
    would once; the next test on the same worker gets the level of before any test, or its
    captured records and stderr hold another test's INFO lines. Not the level this test started
    at: a module fixture that ran a command (set up before this fixture) would have set that."""
    yield
    logging.getLogger().setLevel(_ROOT_LEVEL)


# A read that fails watches its step folder for REMOVAL_WATCH_SECONDS (1 s) for a training run's
# removal in progress before it calls the checkpoint damaged: a wait that hundreds of damaged-checkpoint
# tests would each pay (21.9 s over tests/run, test_init_from.py and test_run_start_checks.py alone).
# Tests watch 0.1 s; the removal races keep the real watch.
SHORT_REMOVAL_WATCH_SECONDS = 0.1


@pytest.fixture(autouse=True)
def _short_removal_watch(request, monkeypatch):
    if request.node.get_closest_marker("real_removal_watch") is None:
        from jaxformer.run import removal

        monkeypatch.setattr(removal, "REMOVAL_WATCH_SECONDS", SHORT_REMOVAL_WATCH_SECONDS)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Multi30k prepared once per test session (per worker) as array_record files."""
    from jaxformer.data.sources import get_builder
    from jaxformer.training.experiment import default_config

    directory = tmp_path_factory.mktemp("tfds")
    data = default_config().data  # multi30k, the vendored copy
    data.data_dir = str(directory)
    get_builder(data).download_and_prepare()
    return directory


@pytest.fixture
def no_data(monkeypatch):
    """Preparing a training run's data fails the test: for refusals that must come first."""
    from jaxformer.training import run_start

    def prepared(*args):
        pytest.fail("the data was prepared before the refusal")

    monkeypatch.setattr(run_start, "builder_for_run", prepared)


# ------------------------------------------------------------------------------------------
# A workdir holding an untrained tiny model and a real tokenizer: what the decoding code and
# the commands read, without spending test time on training.
# ------------------------------------------------------------------------------------------

RAW = pathlib.Path(__file__).parents[1] / "jaxformer" / "data" / "raw" / "multi30k"


def read_raw(name, count=None):
    import gzip

    with gzip.open(RAW / name, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    return lines if count is None else lines[:count]


def make_workdir(workdir, data_dir=None, steps=(1,), scale=lambda step: 1.0, data=None, data_fingerprint=None):
    """Checkpoints of a random tiny model (parameters times `scale(step)`) with run metadata: its
    data section the defaults with `data`'s keys, trained on data of `data_fingerprint`."""
    import flax.linen as nn
    import jax.numpy as jnp

    from jaxformer.data.tokenizer import train_tokenizer
    from jaxformer.model.config import preset
    from jaxformer.model.transformer import Transformer
    from jaxformer.training import experiment

    sentences = read_raw("train.en.gz", 1500) + read_raw("train.de.gz", 1500)
    tokenizer = train_tokenizer(sentences, vocab_size=500)
    model_config = preset("tiny", vocab_size=tokenizer.vocab_size)
    config = experiment.default_config()
    config.model = experiment.model_section("tiny")
    config.tokenizer.vocab_size = tokenizer.vocab_size
    if data_dir is not None:
        config.data.data_dir = str(data_dir)
    for key, value in (data or {}).items():
        config.data[key] = value
    params = nn.meta.unbox(
        Transformer(model_config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))[
            "params"
        ]
    )
    scaled = {step: jax.tree.map(lambda leaf, step=step: leaf * scale(step), params) for step in steps}
    save_checkpoints(workdir, config, model_config, tokenizer, scaled, data_fingerprint)
    return workdir, params, tokenizer


def make_language_model_workdir(workdir):
    """A checkpoint (step 1) of a random tiny decoder-only model, as configs/multi30k_lm.py builds
    one, with run metadata: what jaxformer-generate reads, without a training run."""
    import flax.linen as nn
    import jax.numpy as jnp

    from jaxformer.data.tokenizer import train_tokenizer
    from jaxformer.model.config import preset
    from jaxformer.model.decoder_only import DecoderOnly
    from jaxformer.training import experiment

    tokenizer = train_tokenizer(read_raw("train.de.gz", 1500), vocab_size=300)
    overrides = {"architecture": "decoder_only", "share_embeddings": True}
    model_config = preset("tiny", vocab_size=tokenizer.vocab_size, **overrides)
    config = experiment.default_config()
    config.model = experiment.model_section("tiny", **overrides)
    config.tokenizer.vocab_size = tokenizer.vocab_size
    params = nn.meta.unbox(DecoderOnly(model_config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])
    save_checkpoints(workdir, config, model_config, tokenizer, {1: params})
    return workdir


def save_checkpoints(workdir, config, model_config, tokenizer, params_by_step, data_fingerprint=None):
    """`params_by_step` saved as `workdir`'s checkpoints, with run metadata: `config` (a
    ConfigDict), `model_config` and `tokenizer`, trained on data of `data_fingerprint`."""
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.run.directory import RunDirectory
    from jaxformer.run.metadata import CheckpointMetadata

    metadata = CheckpointMetadata(
        config=config.to_dict(),
        model=model_config.to_dict(),
        tokenizer=tokenizer.model_proto,
        data_fingerprint=data_fingerprint,
        step=0,
    )
    checkpointer = Checkpointer(RunDirectory(workdir).checkpoints, keep=None)
    for step, params in params_by_step.items():
        checkpointer.save_params(step, params, metadata.replace(step=step))
    checkpointer.close()


def scored_validation(bleu):
    """A stand-in for the final choice's validation split (`final_choice.ValidationSet`), which
    decodes nothing: each candidate scores BLEU `bleu(settings)` under the search `settings` (the
    config's decoding, or those of `with_settings`), lowercase BLEU 11 and chrF 50; `calls` counts
    the translations scored."""
    from jaxformer.training.validation_bleu import decode_settings

    class Scored:
        sources = ["a", "b", "c"]
        calls = 0

        def __init__(self, config, *_, settings=None):
            self.settings = settings or decode_settings(config)

        def with_settings(self, settings):
            return Scored(None, settings=settings)

        def score(self, params):
            Scored.calls += 1
            return {"bleu": bleu(self.settings), "lowercase_bleu": 11.0, "chrf": 50.0}

    return Scored


@pytest.fixture(scope="session")
def decoding_workdir(tmp_path_factory, data_dir):
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("decoding-workdir"), data_dir)
    return workdir


@pytest.fixture(scope="session")
def language_model_workdir(tmp_path_factory):
    return make_language_model_workdir(tmp_path_factory.mktemp("language-model-workdir"))


# ------------------------------------------------------------------------------------------
# The shipped language models (multi30k_mlm, multi30k_lm) trained at test size once per session
# (per worker), for tests/training/test_language_models.py and test_composed_translator.py: both
# are in the xdist group "language-models", so one worker trains them, once.
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def trained_language_models(tmp_path_factory, data_dir):
    """Each config trained for 40 steps, by name: (workdirs, the runs' stderr)."""
    from tests.training.test_language_models import NAMES, TINY, config_flag
    from tests.training.test_loop import train

    workdirs, logs = {}, {}
    for name in NAMES:
        workdirs[name] = tmp_path_factory.mktemp(name)
        logs[name] = train(workdirs[name], data_dir, config_flag(name), *TINY).stderr
    return workdirs, logs


# ------------------------------------------------------------------------------------------
# A MarianMT directory saved with untied embeddings, built once per session (per worker) for
# tests/interop/test_marian_checks.py and test_marian_directory_checks.py: both are in the xdist
# group "interop-checks", so one worker builds it, once. They import transformers and torch first.
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def untied_marian(tmp_path_factory):
    """A MarianMT directory saved with tie_word_embeddings=False, its model, and its import."""
    from jaxformer.interop.marian import import_marian
    from tests.interop.marian_models import write_marian

    directory = tmp_path_factory.mktemp("untied")
    model = write_marian(directory, tie_word_embeddings=False)
    workdir = tmp_path_factory.mktemp("untied-run") / "run"
    return directory, model, workdir, import_marian(directory, workdir)


# ------------------------------------------------------------------------------------------
# jaxformer installed from its wheel into fresh venvs (tests/install_env.py): the wheel is
# built once for all pytest workers; the install and notebook tests each use their own venv.
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def install_build(tmp_path_factory):
    """The wheel built from this checkout and the links to the test environment's dependencies."""
    from tests.install_env import shared_build

    base = tmp_path_factory.getbasetemp()
    return shared_build((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jaxformer-install")


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory, install_build):
    """A fresh venv, outside the source tree, with jaxformer installed from the wheel."""
    from tests.install_env import install_wheel, make_venv

    venv = make_venv(tmp_path_factory.mktemp("installed") / "venv", install_build)
    install_wheel(venv, install_build.wheel, cwd=venv.path.parent)
    return venv


def assert_same_hypotheses(actual, expected, rtol=1e-6):
    """n-best lists [[(text or ids, score), ...], ...] with the same texts (ids) in the same order
    and scores equal to float32 rounding: decoding buffers of other lengths (the translator's
    cache grows, an export's has its full length from the start) change how the CPU blocks
    its sums, not what is decoded."""

    def plain(item):
        return item.tolist() if hasattr(item, "tolist") else item

    assert [[plain(h[0]) for h in hypotheses] for hypotheses in actual] == [
        [plain(h[0]) for h in hypotheses] for hypotheses in expected
    ]
    np.testing.assert_allclose(
        [score for hypotheses in actual for _, score in hypotheses],
        [score for hypotheses in expected for _, score in hypotheses],
        rtol=rtol,
    )


def assert_seed_refused(cls, parts, seed, missing_workdir):
    """`cls(*parts, seed=seed)` (a Translator or a LanguageModel) and `cls.from_workdir` refuse
    `seed` in check_seed's words, the latter before `missing_workdir` is looked at."""
    assert_option_refused(
        cls, parts, {"seed": seed}, f"seed must be an integer from 0 to 4294967295, got {seed!r}", missing_workdir
    )


def assert_option_refused(cls, parts, options, message, missing_workdir):
    """`cls(*parts, **options)` and `cls.from_workdir(missing_workdir, **options)` refuse them
    with `message`, the latter before `missing_workdir` is looked at."""
    for make in (lambda: cls(*parts, **options), lambda: cls.from_workdir(missing_workdir, **options)):
        with pytest.raises(ValueError) as refused:
            make()
        assert str(refused.value) == message
