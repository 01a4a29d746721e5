"""`--config NAME` takes the configs shipped in jaxformer/configs/ by name, anything else as a
path; `--list_configs` lists them and `--print_config` every key, without a workdir."""

import pathlib
import re

import pytest

import jaxformer.configs
from jaxformer.commands import train
from jaxformer.model.config import ConfigError
from jaxformer.training.config_file import (
    config_path,
    load_config,
    load_config_file,
    packaged_config_directory,
    packaged_config_names,
)

SHIPPED = pathlib.Path(__file__).parents[2] / "jaxformer" / "configs"


def test_names_are_the_shipped_files():
    on_disk = sorted(path.name.removesuffix(".py") for path in SHIPPED.iterdir() if path.name.endswith(".py"))
    assert packaged_config_names() == [name for name in on_disk if name != "__init__"]
    assert {"multi30k", "tiny", "wmt14_base", "wmt14_big"} <= set(packaged_config_names())
    assert packaged_config_directory().resolve() == SHIPPED.resolve()
    for name in packaged_config_names():  # the package's docstring lists every config
        assert f"\n    {name} " in jaxformer.configs.__doc__, name


@pytest.mark.parametrize("name", ["multi30k", "tiny", "wmt14_big"])
def test_a_name_loads_the_shipped_file(name):
    assert load_config(name).to_dict() == load_config_file(SHIPPED / f"{name}.py").to_dict()


def test_anything_with_a_slash_or_py_is_a_path(tmp_path, monkeypatch):
    mine = tmp_path / "mine.py"
    mine.write_text(
        "from jaxformer.configs.tiny import get_config as tiny\n\n"
        "def get_config():\n    config = tiny()\n    config.training.seed = 7\n    return config\n"
    )
    assert load_config(str(mine)).training.seed == 7
    monkeypatch.chdir(tmp_path)
    assert config_path("mine.py") == pathlib.Path("mine.py") and load_config("mine.py").training.seed == 7
    (tmp_path / "tiny").write_text("not a config")  # a file named like a config does not shadow it
    assert config_path("tiny") == packaged_config_directory() / "tiny.py"


@pytest.mark.parametrize(
    "given, message",
    [
        ("mult30k", "no config named 'mult30k'; did you mean multi30k? jaxformer ships "),
        ("nothing_like_it", "no config named 'nothing_like_it'; jaxformer ships "),
        (
            "configs/tiny.py",
            "config file configs/tiny.py does not exist; jaxformer ships a config of that name: --config tiny",
        ),
        ("tiny.py", "config file tiny.py does not exist; jaxformer ships a config of that name: --config tiny"),
        ("elsewhere/mine.py", "config file elsewhere/mine.py does not exist"),
    ],
)
def test_unknown_names_and_missing_files_are_one_line(given, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config(given)
    text = str(error.value)
    assert text.startswith(message) and "\n" not in text, text
    if given.startswith("no") or given == "mult30k":
        assert ", ".join(packaged_config_names()) in text


def test_list_configs_and_print_config_need_no_workdir(capsys):
    assert train.main(["--list_configs"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert str(packaged_config_directory()) in listed[0]
    assert [line.split()[0] for line in listed[1:]] == packaged_config_names()
    assert any(line.split(None, 1)[1].startswith("A tiny model on a slice of Multi30k") for line in listed[1:])

    assert train.main(["--config", "tiny", "--print_config", "--config.training.seed=3"]) == 0
    printed = capsys.readouterr().out
    assert "num_train_steps: 40" in printed and "seed: 3" in printed

    assert train.main(["--config", "tiny"]) == 2
    missing = r"error: the following arguments are required: --workdir; see \S+ --help\n"
    assert re.fullmatch(missing, capsys.readouterr().err)
    assert train.main(["--config", "tiny", "--workdir", " "]) == 2  # not the current directory
    assert re.fullmatch(
        r"error: argument --workdir: must be a path, got ' '; see \S+ --help\n", capsys.readouterr().err
    )
    assert train.main(["--config", "tiny", "--workdir", "gs://bucket/run"]) == 2  # local file operations: gs: a folder
    assert "argument --workdir: must be a local path or a mounted file system (NFS, gcsfuse), not a URL: " in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "also, ignored",
    [
        (["--config", "tiny"], "--config tiny; for one config's keys and values: --config tiny --print_config"),
        (["--workdir", "runs/x", "--config.training.seed=3"], "--workdir runs/x, --config.training.seed=3"),
        (["--print_config"], "--print_config"),
    ],
)
def test_list_configs_refuses_what_it_would_ignore_in_one_line(capsys, also, ignored):
    assert train.main(["--list_configs", *also]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing listed
    assert re.fullmatch(
        rf"error: --list_configs lists every shipped config and takes no {re.escape(ignored)}; see \S+ --help\n",
        captured.err,
    ), captured.err


def test_help_says_how_to_list_configs_and_keys(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = capsys.readouterr().out
    assert "--list_configs" in text and "--print_config" in text and "jaxformer-train --config multi30k" in text


def test_usage_shows_config_and_workdir_as_required_and_the_forms_that_need_less(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    usage = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert usage[0].startswith("usage: ") and " --config CONFIG --workdir WORKDIR " in usage[0]
    assert usage[2].endswith(" --config CONFIG [--config.KEY=VALUE ...] --print_config")
    assert usage[3].endswith(" --list_configs") and "[--config CONFIG]" not in "".join(usage)
    assert train.main(["--list_configs"]) == 0
    assert train.main(["--config", "tiny"]) == 2
    assert "the following arguments are required: --workdir" in capsys.readouterr().err
