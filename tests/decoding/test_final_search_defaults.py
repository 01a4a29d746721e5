"""The search of --checkpoint final: the one the run's final choice was made with (its method,
beam size, stop rule, max_extra_length), not the commands' defaults, unless a flag (or, from
Python, `settings`) says otherwise; other checkpoints keep the defaults. The alpha the choice kept
goes with that search: tests/decoding/test_checkpoint_alpha.py."""

import logging

import pytest

from jaxformer.commands import decoding_flags, evaluate, translate
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.loading import load_checkpoint
from tests.decoding.test_checkpoint_alpha import CHOSEN, searched_by, with_final_choice

pytestmark = pytest.mark.xdist_group("decoding-workdir")
# None is DecodeSettings' default, nor the commands' (beam 4, current_length, 50).
CHOSEN_WITH = {"beam_size": 5, "stop": "exact", "max_extra_length": 30}
COMMANDS = ["translate", "evaluate", "export"]


@pytest.fixture(scope="module")
def beam5_workdir(decoding_workdir, tmp_path_factory):
    """decoding_workdir with a final choice made with beam search under CHOSEN_WITH."""
    return with_final_choice(decoding_workdir, tmp_path_factory.mktemp("beam5") / "run", **CHOSEN_WITH)


@pytest.fixture(scope="module")
def greedy_workdir(decoding_workdir, tmp_path_factory):
    """decoding_workdir with a final choice made with greedy search, its max_extra_length 30."""
    workdir = tmp_path_factory.mktemp("greedy") / "run"
    return with_final_choice(decoding_workdir, workdir, kept=None, method="greedy", max_extra_length=30)


def recorded_search(workdir) -> dict:
    """The search settings final/'s metadata records, read from its config as saved."""
    decoding = load_checkpoint(workdir, "final", params=False)[1].config["decoding"]
    return {key: decoding[key] for key in ("method", *CHOSEN_WITH)}


def searched(settings: DecodeSettings) -> dict:
    return {key: getattr(settings, key) for key in ("method", *CHOSEN_WITH)}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_on_final_searches_as_its_choice_was_made(command, beam5_workdir, tmp_path, monkeypatch, capsys):
    settings, lines = searched_by(command, beam5_workdir, [], tmp_path, monkeypatch, capsys)
    assert recorded_search(beam5_workdir) == {"method": "beam", **CHOSEN_WITH}
    assert searched(settings) == recorded_search(beam5_workdir)  # was beam 4, current_length, 50
    assert settings.alpha == CHOSEN
    assert not [line for line in lines if line.startswith("W ")]  # was "another search than this one (...)"
    assert (
        f"I {'' if command == 'export' else 'method beam, '}beam_size 5, stop exact, max_extra_length 30: the run's "
        f"final choice was made with them ({'' if command == 'export' else '--method, '}--beam_size, --stop, "
        "--max_extra_length override them)" in lines
    )


def test_from_workdir_on_final_searches_as_its_choice_was_made(beam5_workdir):
    translator = Translator.from_workdir(beam5_workdir, "final", batch_size=8)
    assert searched(translator.settings) == recorded_search(beam5_workdir)
    assert translator.settings.alpha == CHOSEN
    args = translate.build_parser().parse_args(["--workdir", str(beam5_workdir), "--checkpoint", "final"])
    assert decoding_flags.decode_settings_from_flags(args) == translator.settings  # the same search as the commands'


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_given_on_final_win_with_a_warning(command, beam5_workdir, tmp_path, monkeypatch, capsys):
    flags = ["--beam_size", "3", "--stop", "current_length"]
    settings, lines = searched_by(command, beam5_workdir, flags, tmp_path, monkeypatch, capsys)
    assert (settings.beam_size, settings.stop, settings.max_extra_length) == (3, "current_length", 30)
    assert [line for line in lines if line.startswith("W ")] == [
        f"W alpha {CHOSEN:g} was chosen for another search than this one (beam_size 5 -> 3, stop exact -> "
        "current_length): give --alpha to choose it yourself"
    ]
    taken = "max_extra_length 30: the run's final choice was made with it (--max_extra_length overrides it)"
    if command != "export":  # whose --method, beam unless given, is always given
        taken = (
            "method beam, max_extra_length 30: the run's final choice was made with them "
            "(--method, --max_extra_length override them)"
        )
    assert f"I {taken}" in lines


@pytest.mark.parametrize("command", COMMANDS)
def test_greedy_search_of_a_beam_choice_is_still_given(command, beam5_workdir, tmp_path, monkeypatch, capsys):
    settings, lines = searched_by(command, beam5_workdir, ["--method", "greedy"], tmp_path, monkeypatch, capsys)
    # Not refused for final/'s beam 5, whose settings greedy search would not read; its length limit it reads.
    assert settings == DecodeSettings(method="greedy", max_extra_length=CHOSEN_WITH["max_extra_length"])
    assert [line.split(":")[0] for line in lines if line.startswith("W ")] == [
        "W the run's final choice was made with beam search, and this is greedy search"
    ]


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_greedy_choice_is_searched_greedily_and_its_beam_flags_refused(
    command, greedy_workdir, tmp_path, monkeypatch, capsys
):
    settings, lines = searched_by(command, greedy_workdir, [], tmp_path, monkeypatch, capsys)
    assert (
        searched(settings)
        == recorded_search(greedy_workdir)
        == {
            "method": "greedy",
            "beam_size": 4,
            "stop": "current_length",
            "max_extra_length": 30,
        }
    )
    assert not [line for line in lines if line.startswith("W ")]
    settings, _ = searched_by(command, greedy_workdir, ["--method", "beam"], tmp_path, monkeypatch, capsys)
    assert (settings.method, settings.beam_size, settings.max_extra_length) == ("beam", 4, 30)
    # A beam flag without --method would be ignored by the choice's greedy search: refused, before any parameter.
    monkeypatch.setattr(Checkpointer, "_restore_params", lambda *args: pytest.fail("a parameter was read"))
    command_main = {
        "translate": translate.main,
        "evaluate": evaluate.main,
    }
    text = tmp_path / "text"
    flags = ["--input", str(text)] if command == "translate" else ["--source", str(text), "--reference", str(text)]
    assert (
        command_main[command](["--workdir", str(greedy_workdir), "--checkpoint", "final", "--beam_size", "8", *flags])
        == 2
    )
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --beam_size 8 applies to --method beam, not greedy: the search the run's final choice was made "
        "with, which --checkpoint final decodes with unless --method is given"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_other_checkpoints_keep_the_commands_defaults(command, beam5_workdir, tmp_path, monkeypatch, capsys):
    step = str(load_checkpoint(beam5_workdir, "latest", params=False)[0])
    for checkpoint in ("latest", step):
        settings, _ = searched_by(command, beam5_workdir, [], tmp_path, monkeypatch, capsys, checkpoint=checkpoint)
        assert searched(settings) == searched(DecodeSettings()), checkpoint
    assert Translator.from_workdir(beam5_workdir, "latest").settings == DecodeSettings()


def test_from_workdir_settings_given_on_final_are_kept(beam5_workdir, caplog):
    given = DecodeSettings(beam_size=2, max_extra_length=8)
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        assert Translator.from_workdir(beam5_workdir, "final", given).settings == given
    assert not [message for message in caplog.messages if "final choice was made with them" in message]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_method_given_on_final_keeps_the_runs_output_length_limit(
    command, beam5_workdir, greedy_workdir, tmp_path, monkeypatch, capsys
):
    # Every search reads max_extra_length: the choice's method spelt out, or another, keeps final/'s.
    for workdir, method in ((greedy_workdir, "greedy"), (beam5_workdir, "sample")):
        limit = recorded_search(workdir)["max_extra_length"]
        assert limit != DecodeSettings.max_extra_length  # the flag's default, which they searched with before
        settings, lines = searched_by(command, workdir, ["--method", method], tmp_path, monkeypatch, capsys)
        assert (settings.method, settings.max_extra_length) == (method, limit)
        taken = f"max_extra_length {limit}: the run's final choice was made with it (--max_extra_length overrides it)"
        assert f"I {taken}" in lines
    given = ["--method", "greedy", "--max_extra_length", "12"]
    settings, lines = searched_by(command, beam5_workdir, given, tmp_path, monkeypatch, capsys)
    assert settings.max_extra_length == 12
    assert not [line for line in lines if "max_extra_length" in line]
