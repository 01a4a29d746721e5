"""A path flag's "~" is the home folder, as the shell reads it: `--workdir=~/runs` reaches the
command as written (bash expands "~" only at a word's start), and trained in a folder literally
named "~" in the current directory, without a word."""

import argparse
import os
import pwd

import pytest

from jaxformer.commands import average_checkpoints, convert, evaluate, export, generate, sweep, train, translate
from jaxformer.commands.common import path_text

COMMANDS = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in (train, translate, evaluate, generate, average_checkpoints, export, convert, sweep)
}
# Flags that take text and are not a path_text: a shipped name or a path, read by shipped_file_path
# (tests/training/test_shipped_names.py), or not a path at all.
NOT_PATH_FLAGS = {"--config", "--sweep", "--split", "--source_language", "--target_language", "--coordinator_address"}


def path_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags of `parser` that take a local path."""
    return [action.option_strings[0] for action in parser._actions if action.type is path_text]


def text_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags of `parser` that take any text as it is: a path among them would keep its "~"."""
    return [
        action.option_strings[0]
        for action in parser._actions
        if action.option_strings and action.nargs != 0 and action.type is None and action.choices is None
    ]


def parsed_alone(command: str, flag: str, value: str) -> str:
    """`value` as the command's parser reads it in `flag=value`, the other flags it requires left out."""
    parser = COMMANDS[command].build_parser()
    for action in parser._actions:
        action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    args = parser.parse_args([f"{flag}={value}"])
    return getattr(args, next(action.dest for action in parser._actions if flag in action.option_strings))


COMMAND_PATH_FLAGS = [(name, flag) for name, module in COMMANDS.items() for flag in path_flags(module.build_parser())]


def test_every_command_has_its_path_flags_read_as_paths():
    assert {"--workdir", "--input", "--output", "--source", "--reference", "--json", "--from_hf", "--to_hf"} <= {
        flag for _, flag in COMMAND_PATH_FLAGS
    }
    for name, module in COMMANDS.items():
        assert set(text_flags(module.build_parser())) <= NOT_PATH_FLAGS, name


@pytest.mark.parametrize(("command", "flag"), COMMAND_PATH_FLAGS)
def test_a_path_flag_reads_the_home_folder_as_the_shell_would(command, flag, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert parsed_alone(command, flag, "~/runs/a") == str(tmp_path / "home" / "runs" / "a")
    assert parsed_alone(command, flag, "~") == str(tmp_path / "home")
    user = pwd.getpwuid(os.getuid())
    assert parsed_alone(command, flag, f"~{user.pw_name}/a") == os.path.join(user.pw_dir, "a")
    assert parsed_alone(command, flag, "runs/~/a") == "runs/~/a"  # a "~" inside a path is a folder's name


def test_train_with_workdir_from_the_home_folder_runs_there_and_makes_no_folder_named_tilde(tmp_path, monkeypatch):
    from jaxformer.training import loop

    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    workdirs = []
    monkeypatch.setattr(loop, "train_and_evaluate", lambda config, workdir, **_: workdirs.append(workdir) or {})
    assert train.main(["--config", "tiny", "--workdir=~/run"]) == 0
    assert workdirs == [str(home / "run")] and not list(here.iterdir())


def test_a_home_folder_of_no_user_is_one_line_and_makes_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main(["--config", "tiny", "--workdir=~no_such_user_jaxformer/run"]) == 2
    assert capsys.readouterr().err == (
        "error: argument --workdir: '~no_such_user_jaxformer/run' starts with ~no_such_user_jaxformer, but there "
        "is no user 'no_such_user_jaxformer' whose home folder that is; for a folder named ~no_such_user_jaxformer "
        f"here, give ./~no_such_user_jaxformer/run; see {train.build_parser().prog} --help\n"
    )
    assert not list(tmp_path.iterdir())
