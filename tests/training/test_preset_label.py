"""A config file's `config.model.preset = "tiny"` after `model_section("base")` (or after
default_config()) renamed base's sizes, which the model kept: a base model trained as "tiny",
without a word, where `--config.model.preset=tiny` sets tiny's sizes. It is a one-line error
before any work; a section built from a preset and then changed is the file's to keep. A run
started with such a file before the rule resumes once the file names the sizes it holds."""

import shutil

import pytest

from jaxformer.commands import train
from jaxformer.errors import EXIT_USER_ERROR
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.training import experiment, loop
from jaxformer.training.config_file import load_config, packaged_config_names
from tests.conftest import make_workdir

HEADER = "from jaxformer.training.experiment import default_config, model_section\n\ndef get_config():\n"
BASE_SIZES = "d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.1"
TINY_SIZES = "d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.1"


def config_file(tmp_path, *lines):
    """A config file: default_config() as `c`, then `lines` run on it."""
    path = tmp_path / "mine.py"
    path.write_text(HEADER + "".join(f"    {line}\n" for line in ["c = default_config()", *lines, "return c"]))
    return path


def error_line(argv, capsys) -> str:
    assert train.main(argv) == EXIT_USER_ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("lines", "named", "held", "sizes"),
    [
        (['c.model.preset = "tiny"'], "tiny", "base", BASE_SIZES),  # default_config()'s section is base's
        (['c.model = model_section("base")', 'c.model.preset = "tiny"'], "tiny", "base", BASE_SIZES),
        (['c.model = model_section("tiny")', 'c.model.preset = "big"'], "big", "tiny", TINY_SIZES),
    ],
    ids=["default_config", "base_section", "tiny_section"],
)
def test_a_preset_renamed_in_a_config_file_is_one_line_before_any_work(
    lines, named, held, sizes, tmp_path, monkeypatch, capsys
):
    trained = []  # a run it would start (base's sizes, on a CPU) is recorded, not run
    monkeypatch.setattr(loop, "train_and_evaluate", lambda config, workdir, **_: trained.append(config) or {})
    path, workdir = config_file(tmp_path, *lines), tmp_path / "run"
    assert error_line(["--config", str(path), "--workdir", str(workdir)], capsys) == (
        f"error: config model.preset='{named}' with {held}'s sizes ({sizes}): setting model.preset changes only "
        f"the name; for {named}'s sizes build the section with model_section('{named}') (then change what you "
        f"like), or give --config.model.preset={named}; to keep {held}'s sizes (as a run started with them "
        f"resumes), set model.preset = '{held}' or give --config.model.preset={held}"
    )
    assert not trained and not workdir.exists()


def test_the_ways_the_error_names_give_the_presets_sizes(tmp_path, capsys):
    renamed = config_file(tmp_path, 'c.model.preset = "tiny"')
    assert train.main(["--config", str(renamed), "--print_config", "--config.model.preset=tiny"]) == 0
    assert "d_model: 32\n" in capsys.readouterr().out
    built = config_file(tmp_path, 'c.model = model_section("tiny")')
    assert train.main(["--config", str(built), "--print_config"]) == 0
    assert "d_model: 32\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    "lines",
    [
        ['c.model = model_section("base", d_model=256, num_heads=4)'],  # as multi30k.py narrows base
        ['c.model = model_section("tiny")', "c.model.d_model = 64"],
        # no preset's sizes: what model_section("big", d_model=32, num_heads=4, ...) builds too
        ['c.model = model_section("tiny")', "c.model.dropout_rate = 0.3", 'c.model.preset = "big"'],
        ['c.model = model_section("base")', 'c.model.preset = "base"'],
    ],
)
def test_a_section_of_the_named_presets_sizes_or_of_no_presets_is_taken(lines, tmp_path, capsys):
    assert train.main(["--config", str(config_file(tmp_path, *lines)), "--print_config"]) == 0, capsys.readouterr()


@pytest.mark.parametrize("name", packaged_config_names())
def test_every_shipped_config_keeps_its_preset(name):
    experiment.validate(load_config(name))


@pytest.fixture(scope="module")
def renamed_run(tmp_path_factory):
    """A run as one started before the rule saved it: tiny's sizes named base, checkpoint 10."""
    workdir, params, tokenizer = make_workdir(tmp_path_factory.mktemp("renamed") / "run", steps=(10,))
    metadata = load_checkpoint(workdir, 10, params=False)[1]
    metadata.config["model"]["preset"] = "base"
    shutil.rmtree(RunDirectory(workdir).checkpoints)
    checkpoints = Checkpointer(RunDirectory(workdir).checkpoints, keep=None)
    checkpoints.save_params(10, params, metadata)
    checkpoints.close()
    return workdir, tokenizer.vocab_size


@pytest.mark.parametrize(
    ("lines", "flags"),
    [
        (['c.model = model_section("tiny")'], []),  # the file corrected: its sizes under their name
        (['c.model = model_section("tiny")', 'c.model.preset = "base"'], ["--config.model.preset=tiny"]),
    ],
    ids=["file_corrected", "flag"],
)
def test_a_run_started_with_a_renamed_preset_resumes_once_its_sizes_are_named(
    lines, flags, renamed_run, tmp_path, capsys, no_data
):
    """The file as it was is refused (the rule), naming the way on; taken, the resume compared the
    name with the checkpoint's and refused 'another configuration' (model.preset: 'base' -> 'tiny')."""
    template, vocab_size = renamed_run
    workdir = tmp_path / "run"
    shutil.copytree(template, workdir)
    (tmp_path / "as_it_was").mkdir()
    kept = config_file(
        tmp_path / "as_it_was",
        'c.model = model_section("tiny")',
        'c.model.preset = "base"',
        f"c.tokenizer.vocab_size = {vocab_size}",
    )
    assert error_line(["--config", str(kept), "--workdir", str(workdir)], capsys).endswith(
        "; to keep tiny's sizes (as a run started with them resumes), set model.preset = 'tiny' or give "
        "--config.model.preset=tiny"
    )
    path = config_file(tmp_path, *lines, f"c.tokenizer.vocab_size = {vocab_size}")
    with pytest.raises(pytest.fail.Exception, match="the data was prepared"):  # past the resume's checks
        train.main(["--config", str(path), "--workdir", str(workdir), *flags])
    assert "error: " not in capsys.readouterr().err
