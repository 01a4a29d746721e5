"""The length penalty of --checkpoint final: the run's chosen alpha, the same from Python
(Translator.from_workdir, export_checkpoint) as from the commands, unless the caller gives one."""

import dataclasses
import logging
import shutil

import pytest

from jaxformer.commands import decoding_flags, export, translate
from jaxformer.decoding.checkpoint_alpha import (
    SETTINGS_LENGTH_PENALTY,
    SETTINGS_RENORMALIZE,
    SETTINGS_SEARCH,
    SETTLED_FIELDS,
    ChosenSearch,
    checkpoint_settings,
)
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint

pytestmark = pytest.mark.xdist_group("decoding-workdir")
CHOSEN = 1.8  # not DecodeSettings' 0.6
SENTENCES = ["A man rides a horse.", "Two children play in the snow."]


@pytest.fixture(scope="module")
def final_workdir(decoding_workdir, tmp_path_factory):
    """decoding_workdir with a final choice: its latest parameters kept with alpha CHOSEN, chosen
    with the config's search but stop="exact" (another stop rule than DecodeSettings')."""
    return with_final_choice(decoding_workdir, tmp_path_factory.mktemp("final-choice") / "run", stop="exact")


def with_final_choice(source, workdir, kept=CHOSEN, alphas=(0.6, CHOSEN), **chosen_with):
    """A copy of the run `source` at `workdir` whose final/ keeps its latest parameters with alpha
    `kept`, chosen among training.final_alphas `alphas` with its config's decoding settings changed
    by `chosen_with`."""
    shutil.copytree(source, workdir)
    step, metadata, params = load_checkpoint(workdir)
    training = {**metadata.config["training"], "final_alphas": alphas}
    config = dict(metadata.config, training=training, decoding={**metadata.config["decoding"], **chosen_with})
    writer = Checkpointer(RunDirectory(workdir).final, keep=None)
    writer.save_params(step, params, metadata.replace(config=config, chosen_from="latest", alpha=kept, bleu=1.0))
    writer.close()
    return workdir


def test_from_workdir_searches_final_with_the_alpha_the_run_chose(final_workdir, caplog):
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        translator = Translator.from_workdir(final_workdir, "final", batch_size=8)
    assert translator.settings == DecodeSettings(alpha=CHOSEN, stop="exact")  # the choice's search, whole
    assert (
        f"length penalty alpha {CHOSEN:g}: chosen on validation by the run "
        "(settings=DecodeSettings(alpha=...) overrides it)" in caplog.messages
    )
    assert not [message for message in caplog.messages if "another search" in message]
    # The search translate and evaluate run without --alpha: the same settings, so the same translations.
    args = translate.build_parser().parse_args(["--workdir", str(final_workdir), "--checkpoint", "final"])
    assert decoding_flags.decode_settings_from_flags(args, args.max_extra_length) == translator.settings

    nbest = translator.translate_nbest(SENTENCES)
    chosen_settings = DecodeSettings(alpha=CHOSEN, stop="exact")
    with_chosen = Translator.from_workdir(final_workdir, "final", chosen_settings, batch_size=8)
    assert with_chosen.translate_nbest(SENTENCES) == nbest
    at_default = translator.with_settings(DecodeSettings())
    assert [[score for _, score in hypotheses] for hypotheses in at_default.translate_nbest(SENTENCES)] != [
        [score for _, score in hypotheses] for hypotheses in nbest
    ]


def test_from_workdir_searches_final_with_the_length_penalty_the_alpha_was_chosen_with(
    decoding_workdir, tmp_path, caplog
):
    workdir = with_final_choice(decoding_workdir, tmp_path / "run", length_penalty="transformers")
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        translator = Translator.from_workdir(workdir, "final", batch_size=8)
    assert translator.settings == DecodeSettings(length_penalty="transformers", alpha=CHOSEN)
    assert (
        "length penalty transformers: the run's final choice was made with it "
        "(settings=DecodeSettings(length_penalty=...) overrides it)" in caplog.messages
    )
    assert not [message for message in caplog.messages if "another search" in message]
    args = translate.build_parser().parse_args(["--workdir", str(workdir), "--checkpoint", "final"])
    assert decoding_flags.decode_settings_from_flags(args, args.max_extra_length) == translator.settings


def test_final_is_searched_with_the_renormalization_its_choice_was_made_with(
    decoding_workdir, tmp_path, caplog, monkeypatch
):
    from jaxformer.commands import export
    from jaxformer.export import exporter

    workdir = with_final_choice(decoding_workdir, tmp_path / "run", renormalize_after_bans=True)
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        translator = Translator.from_workdir(workdir, "final", batch_size=8)
    assert translator.settings == DecodeSettings(alpha=CHOSEN, renormalize_after_bans=True)
    assert (
        "scores renormalized over the allowed tokens: the run's final choice was made so "
        "(settings=DecodeSettings(renormalize_after_bans=...) overrides it)" in caplog.messages
    )
    assert not [message for message in caplog.messages if "another search" in message]
    assert Translator.from_workdir(workdir, "latest").settings == DecodeSettings()  # no other checkpoint keeps one

    def from_flags(*flags):
        args = translate.build_parser().parse_args(["--workdir", str(workdir), "--checkpoint", "final", *flags])
        return decoding_flags.decode_settings_from_flags(args, args.max_extra_length)

    assert from_flags() == translator.settings
    # Greedy search reads no final/ (renormalized or not, it chooses the same tokens) unless told.
    assert not from_flags("--method", "greedy").renormalize_after_bans
    assert from_flags("--method", "greedy", "--renormalize_after_bans", "true").renormalize_after_bans
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        assert from_flags("--renormalize_after_bans", "false") == DecodeSettings(alpha=CHOSEN)
    assert (
        f"alpha {CHOSEN:g} was chosen for another search than this one (renormalize_after_bans True -> False): "
        "give --alpha to choose it yourself" in caplog.messages
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        Translator.from_workdir(workdir, "final", DecodeSettings(beam_size=2))
    assert "renormalize_after_bans=False as given (the run's final choice was made with True)" in caplog.messages

    def reached(config, settings, *_, **__):  # the export's lowering: what it was asked for is known
        raise _Reached(settings)

    monkeypatch.setattr(exporter, "export_search", reached)
    for export_final in (
        lambda: exporter.export_checkpoint(workdir, tmp_path / "export", "final", platforms=("cpu",)),
        lambda: export.main(["--workdir", str(workdir), "--checkpoint", "final", "--output", str(tmp_path / "e")]),
    ):
        with pytest.raises(_Reached) as searched:
            export_final()
        assert searched.value.args[0] == translator.settings  # the export decodes as the run's translator


def test_settings_given_keep_their_alpha_on_final(final_workdir, caplog):
    given = DecodeSettings(beam_size=2, max_extra_length=8)
    with caplog.at_level(logging.INFO, logger="jaxformer"):
        translator = Translator.from_workdir(final_workdir, "final", given)
    assert translator.settings == given
    assert f"length penalty alpha 0.6 as given (the run chose {CHOSEN:g} on validation)" in caplog.messages
    caplog.clear()
    for checkpoint, settings in (("latest", None), ("final", DecodeSettings(method="greedy", max_extra_length=8))):
        with caplog.at_level(logging.INFO, logger="jaxformer"):
            Translator.from_workdir(final_workdir, checkpoint, settings)
        assert not [message for message in caplog.messages if "alpha" in message], checkpoint
    assert Translator.from_workdir(final_workdir, "latest").settings == DecodeSettings()


def test_export_checkpoint_exports_final_with_the_alpha_the_run_chose(final_workdir, tmp_path, monkeypatch):
    from jaxformer.export import exporter

    exported = []

    class Lowered(Exception):
        pass

    def export_search(config, settings, *args, **kwargs):
        exported.append(settings)
        raise Lowered  # what was asked for is known; the lowering itself is tested in tests/export

    monkeypatch.setattr(exporter, "export_search", export_search)
    for settings in (None, dataclasses.replace(DecodeSettings(), alpha=0.25)):
        with pytest.raises(Lowered):
            exporter.export_checkpoint(final_workdir, tmp_path / "export", "final", settings, platforms=("cpu",))
    assert [settings.alpha for settings in exported] == [CHOSEN, 0.25]


class _Reached(Exception):
    """The command got to its search with these settings."""


def searched_by(command, workdir, flags, tmp_path, monkeypatch, capsys, checkpoint="final"):
    """(the settings `command` --checkpoint `checkpoint` `flags` got to its search with, the lines
    it logged as "I message" or "W message")."""
    from jaxformer.commands import evaluate, export
    from jaxformer.export import exporter

    def reached(*args, **_):  # Translator.translate, or the export's lowering: (self or config, settings, ...)
        raise _Reached(args[0].settings if command != "export" else args[1])

    monkeypatch.setattr(Translator, "translate", reached)
    monkeypatch.setattr(exporter, "export_search", reached)
    text = tmp_path / "text"
    text.write_text("A man rides a horse.\n")
    main, command_flags = {
        "translate": (translate.main, ["--input", str(text)]),
        "evaluate": (evaluate.main, ["--source", str(text), "--reference", str(text)]),
        "export": (export.main, ["--output", str(tmp_path / "export"), "--platforms", "cpu"]),
    }[command]
    capsys.readouterr()
    with pytest.raises(_Reached) as searched:
        main(["--workdir", str(workdir), "--checkpoint", checkpoint, *flags, *command_flags])
    return searched.value.args[0], [line.split(" ", 1)[1] for line in capsys.readouterr().err.splitlines()]


@pytest.mark.parametrize("command", ["translate", "evaluate", "export"])
@pytest.mark.parametrize("alpha_flags", [[], ["--alpha", "0.25"]])
def test_a_command_on_final_reads_its_chosen_search_once(
    command, alpha_flags, final_workdir, tmp_path, monkeypatch, capsys
):
    from tests.run.test_final_choice_kept import counted_reads

    reads = counted_reads(monkeypatch)
    settings, lines = searched_by(command, final_workdir, alpha_flags, tmp_path, monkeypatch, capsys)
    # The search settled from the one read of final/'s metadata the checkpoint is read with: was 2 (final/'s
    # search read before the checkpoint), and 3 for export (its model checked from a read of its own).
    assert reads["metadata"] == 1
    assert settings.alpha == (0.25 if alpha_flags else CHOSEN)
    logged = [line.split(" ", 1)[1] for line in lines]  # "I message"
    assert [message for message in logged if "alpha" in message] == (
        [f"length penalty alpha 0.25 as given (the run chose {CHOSEN:g} on validation)"]
        if alpha_flags
        else [f"length penalty alpha {CHOSEN:g}: chosen on validation by the run (--alpha overrides it)"]
    )  # its stop rule is the choice's too (tests/decoding/test_final_search_defaults.py)


GREEDY_CHOICE_SEARCHED_WITH_BEAMS = (
    "W the run's final choice was made with greedy search, and this is beam search (beam 4): give --method greedy "
    "(DecodeSettings(method='greedy') from Python) to decode as it was chosen"
)


@pytest.mark.parametrize("command", ["translate", "evaluate", "export"])
def test_a_beam_search_of_a_greedy_choice_says_so(command, decoding_workdir, tmp_path, monkeypatch, capsys):
    # The form as a run's start settles it (run_start.settle_inherited_decoding), though greedy search reads none.
    workdir = with_final_choice(decoding_workdir, tmp_path / "run", kept=None, method="greedy", length_penalty="gnmt")
    beam = [] if command == "export" else ["--method", "beam"]  # the others search greedily, as chosen, by default
    settings, lines = searched_by(command, workdir, beam, tmp_path, monkeypatch, capsys)
    assert (settings.method, settings.alpha) == ("beam", 0.6)  # the choice read no alpha: the default
    assert [line for line in lines if line.startswith("W ")] == [GREEDY_CHOICE_SEARCHED_WITH_BEAMS]  # was none
    # Its length penalty's form is the run's, which the greedy choice did not read (was "made with it").
    assert (
        "I length penalty gnmt: the run's decoding.length_penalty; its final choice, made with greedy search, read "
        "none (--length_penalty overrides it)" in lines
    )
    assert not [line for line in lines if "made with it" in line]
    # Greedy search, as chosen: with --method greedy, or without --method but for an export's (beam search).
    for flags in (["--method", "greedy"], *([] if command == "export" else [[]])):
        settings, lines = searched_by(command, workdir, flags, tmp_path, monkeypatch, capsys)
        assert settings.method == "greedy" and not [line for line in lines if line.startswith("W ")]


def test_from_workdir_says_it_searches_a_greedy_choice_with_beams(decoding_workdir, tmp_path, caplog):
    workdir = with_final_choice(decoding_workdir, tmp_path / "run", kept=None, method="greedy")
    for settings, beam in ((None, None), (DecodeSettings(beam_size=2), 2), (DecodeSettings(method="greedy"), None)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jaxformer"):
            searched = Translator.from_workdir(workdir, "final", settings).settings
        assert searched.method == ("beam" if beam else "greedy")  # without settings, the choice's
        said = GREEDY_CHOICE_SEARCHED_WITH_BEAMS[2:].replace("(beam 4)", f"(beam {beam})")
        assert caplog.messages == ([said] if beam else []), settings


def test_the_flags_and_python_settle_final_search_with_one_rule(caplog):
    """An export's beam search of a greedy choice, settled by the flags (with_chosen_search) and by
    Python (checkpoint_settings): the same search and lines but for how each names its override,
    the warning after them both ways (export_checkpoint's, after the flags'). No run is read."""
    chosen_with = dict(
        beam_size=5, length_penalty="transformers", max_extra_length=30, stop="exact", renormalize_after_bans=True
    )
    greedy = ChosenSearch("greedy", None, False, 0.6, "transformers", True, chosen_with)

    def settled(settle):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="jaxformer"):
            search = settle()
        return {key: getattr(search, key) for key in SETTLED_FIELDS}, list(caplog.messages)

    args = export.build_parser().parse_args(["--workdir", "run", "--output", "out", "--checkpoint", "final"])
    from_flags, flag_lines = settled(lambda: decoding_flags.with_chosen_search(args, greedy))
    from_python, python_lines = settled(lambda: checkpoint_settings("run", "final", None, greedy, method="beam"))
    assert from_flags == from_python == {"method": "beam", **chosen_with}
    renamed = [
        line.replace("--beam_size, --stop, --max_extra_length override them", f"{SETTINGS_SEARCH} overrides them")
        .replace("--length_penalty", SETTINGS_LENGTH_PENALTY)
        .replace("--renormalize_after_bans", SETTINGS_RENORMALIZE)
        for line in flag_lines
    ]
    assert len(renamed) == 3 and renamed != flag_lines
    assert python_lines == [*renamed, GREEDY_CHOICE_SEARCHED_WITH_BEAMS[2:].replace("(beam 4)", "(beam 5)")]


BEAM_CHOICE_SEARCHED_GREEDILY = (
    "W the run's final choice was made with beam search, and this is greedy search: give --method beam "
    "(DecodeSettings(method='beam') from Python) to decode as it was chosen"
)


@pytest.mark.parametrize("command", ["translate", "evaluate", "export"])
def test_greedy_search_of_a_beam_choice_says_so(command, final_workdir, tmp_path, monkeypatch, capsys):
    settings, lines = searched_by(command, final_workdir, ["--method", "greedy"], tmp_path, monkeypatch, capsys)
    assert settings.method == "greedy"
    assert [line for line in lines if line.startswith("W ")] == [BEAM_CHOICE_SEARCHED_GREEDILY]  # was none
    settings, lines = searched_by(command, final_workdir, [], tmp_path, monkeypatch, capsys)
    assert settings.method == "beam" and not [line for line in lines if "decode as it was chosen" in line]


def test_from_workdir_says_it_searches_a_beam_choice_otherwise(final_workdir, caplog):
    for method, named in (("greedy", "greedy search"), ("sample", "sampling"), ("beam", None)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jaxformer"):
            Translator.from_workdir(final_workdir, "final", DecodeSettings(method=method, max_extra_length=8))
        said = [message for message in caplog.messages if "decode as it was chosen" in message]
        assert said == ([BEAM_CHOICE_SEARCHED_GREEDILY[2:].replace("greedy search", named)] if named else []), method


def test_a_choice_that_compared_no_alpha_names_its_alpha_as_decoding_alpha(decoding_workdir, tmp_path, caplog):
    def searched(workdir, *flags):
        caplog.clear()
        args = translate.build_parser().parse_args(["--workdir", str(workdir), "--checkpoint", "final", *flags])
        with caplog.at_level(logging.INFO, logger="jaxformer"):
            alpha = decoding_flags.decode_settings_from_flags(args, args.max_extra_length).alpha
        return alpha, [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]

    # Saved as choose_final saves it now: decoding.alpha kept, its other search named as a chosen alpha's is.
    workdir = with_final_choice(decoding_workdir, tmp_path / "now", kept=2.2, alphas=(), alpha=2.2, stop="exact")
    assert searched(workdir, "--stop", "current_length") == (
        2.2,
        [
            "the run's final choice was scored with alpha 2.2 under another search than this one "
            "(stop exact -> current_length): give --alpha to choose it yourself"
        ],
    )
    # Saved before final/ kept it: searched with 0.6 as then, and said where the choice was scored with another.
    workdir = with_final_choice(decoding_workdir, tmp_path / "before", kept=None, alphas=(), alpha=2.2)
    assert searched(workdir) == (
        0.6,
        [
            "length penalty alpha 0.6 (final/ was saved before it kept the alpha of a choice that compared none): "
            "the run's final choice was scored with decoding.alpha 2.2, which --alpha gives"
        ],
    )
    workdir = with_final_choice(decoding_workdir, tmp_path / "before at 0.6", kept=None, alphas=())
    assert searched(workdir) == (0.6, [])
