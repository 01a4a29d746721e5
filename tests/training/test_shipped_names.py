"""--config and --sweep take a shipped file by name, anything else as a path, with the same hints
when it is not there: a near name, the shipped file a missing path's name means, `./` for a local
file named like a name (jaxformer/training/shipped_names.py, their one owner)."""

import pathlib
import re

import pytest

from jaxformer.commands import sweep as sweep_command
from jaxformer.model.config import ConfigError
from jaxformer.training.config_file import load_config
from jaxformer.training.sweep_file import load_sweep

SHIPPED = pathlib.Path(__file__).parents[2] / "jaxformer" / "configs"
KINDS = {  # kind: (flag, loader, a shipped name, its folder)
    "config": ("--config", load_config, "multi30k", SHIPPED),
    "sweep": ("--sweep", load_sweep, "multi30k_hour", SHIPPED / "sweeps"),
}


def shipped(folder):
    return ", ".join(sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_name_or_path_that_is_not_there_gets_the_same_hints_for_config_and_sweep(kind, tmp_path, monkeypatch):
    flag, load, name, folder = KINDS[kind]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").write_text("a local file named like a name")
    that_name = f"jaxformer ships a {kind} of that name: {flag} {name}"
    expected = {
        f"{name}s": f"no {kind} named '{name}s'; did you mean {name}? jaxformer ships {shipped(folder)} "
        f"(or give the path of a .py {kind} file)",
        "zzz": f"no {kind} named 'zzz'; jaxformer ships {shipped(folder)} (or give the path of a .py {kind} file)",
        "mine": f"no {kind} named 'mine'; to read the file mine, give it as {flag} ./mine; jaxformer ships ",
        f"{name}.py": f"{kind} file {name}.py does not exist; {that_name}",
        f"old/{name}.py": f"{kind} file old/{name}.py does not exist; {that_name}",
        "elsewhere/other.py": f"{kind} file elsewhere/other.py does not exist",
    }
    for given, message in expected.items():
        with pytest.raises(ConfigError) as error:
            load(given)
        assert str(error.value).startswith(message) and "\n" not in str(error.value), (given, str(error.value))


def test_jaxformer_sweep_names_a_near_sweep_in_one_line(tmp_path, capsys):
    workdir = tmp_path / "sweep"
    code = sweep_command.main(["--config", "tiny", "--sweep", "multi30k_hours", "--workdir", str(workdir)])
    error = capsys.readouterr().err
    assert code == 2 and not workdir.exists(), error
    assert re.fullmatch(r"error: no sweep named 'multi30k_hours'; did you mean multi30k_hour\? [^\n]*\n", error), error


@pytest.mark.parametrize("kind", KINDS)
def test_a_path_from_the_home_folder_is_read_as_the_shell_would_expand_it(kind, tmp_path, monkeypatch):
    """`--config=~/mine.py` reaches jaxformer unexpanded (the shell expands `~` only at a word's
    start): it was "config file ~/mine.py does not exist", the file there, while the config's own
    path keys (data.raw_dir, ...) expand `~`."""
    flag, load, name, folder = KINDS[kind]
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "mine.py").write_bytes((folder / f"{name}.py").read_bytes())
    assert load("~/mine.py") == load(name)
