"""The final choice a run keeps in final/: verified before a finished run reports it as made (a
damaged one is set aside and made again), named as outdated when the run trained past it, and
refused by the commands, damaged, in one line before their work; evaluate reads any checkpoint it
names (final or a step) whole, once, before its data, and translate once."""

import json
import logging
import shutil
import types

import ml_collections
import pytest

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import final_choice
from tests.conftest import make_workdir, scored_validation

# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("final-choice-kept")


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    """A run with checkpoints 10 and 20."""
    workdir, params, _ = make_workdir(tmp_path_factory.mktemp("template") / "run", steps=(10, 20))
    return workdir, params


_Scored = scored_validation(lambda settings: 10.0)  # BLEU 10 for every candidate


@pytest.fixture
def choose(run, monkeypatch):
    """The loop's call of choose_final at step 20, the run's end (scored by `_Scored`)."""
    workdir, _ = run
    step, metadata, params = load_checkpoint(workdir)
    config = ml_collections.ConfigDict(metadata.config)
    config.training.final_choice, config.training.num_train_steps, config.training.average_last = True, step, 2
    monkeypatch.setattr(final_choice, "ValidationSet", _Scored)
    tokenizers = types.SimpleNamespace(source=None, target=None)
    return lambda: final_choice.choose_final(
        config, None, tokenizers, None, RunDirectory(workdir), step, params, metadata
    )


def _wrong_array_checksum(step_directory):
    """Damage as the arrays' checksums see it (a flipped bit in a data file, found reliably)."""
    path = step_directory / "metadata" / "metadata"
    values = json.loads(path.read_text())
    first = sorted(values["checksums"]["arrays"])[0]
    values["checksums"]["arrays"][first] = "deadbeef" * 2  # the metadata's own digest leaves its checksums out
    path.write_text(json.dumps(values))
    return first


@pytest.mark.parametrize("damage", ["array", "metadata", "state folder"])
def test_a_damaged_choice_is_set_aside_and_made_again(damage, run, choose, caplog):
    workdir, _ = run
    final = RunDirectory(workdir).final
    first = choose()
    if damage == "array":
        named = f"array {_wrong_array_checksum(final / '20')} does not match its checksum"
    elif damage == "metadata":
        (final / "20" / "metadata" / "metadata").write_text("{")
        named = "cannot read"
    else:
        shutil.rmtree(final / "20" / "state")
        named = "it has no state folder"
    calls = _Scored.calls
    with caplog.at_level(logging.WARNING):
        again = choose()  # was "already made at step 20", and evaluate --checkpoint final failed later
    assert _Scored.calls > calls and again == first  # chosen again, alike
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    (warning,) = [message for message in warnings if message.startswith("final choice: the one made at step 20")]
    assert named in warning and warning.endswith("; making it again") and "\n" not in warning
    (aside,) = final.glob("20.damaged-*")
    assert f"moved the damaged checkpoint of step 20 to {aside}" in warnings
    assert load_checkpoint(workdir, "final")[0] == 20  # whole again


def test_a_whole_choice_is_kept_without_scoring_again(run, choose):
    first = choose()
    calls = _Scored.calls
    assert choose() == first and _Scored.calls == calls
    assert not list(RunDirectory(run[0]).final.glob("20.*"))


def test_final_names_the_steps_the_run_trained_past_it(run, caplog):
    workdir, params = run
    metadata = load_checkpoint(workdir, 20, params=False)[1]
    writer = Checkpointer(RunDirectory(workdir).final, keep=None)
    writer.save_params(10, params, metadata.replace(step=10, chosen_from="latest", bleu=1.0))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # a command reads final more than once: said once
            assert load_checkpoint(workdir, "final", params=False)[0] == 10
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING] == [
        f"the final choice of {workdir} was made at step 10, and the run trained past it, to step 20; running its "
        "training command again makes the choice at the run's end (until then, final is step 10's)"
    ]
    caplog.clear()
    writer.save_params(20, params, metadata.replace(step=20, chosen_from="latest", bleu=1.0))  # the choice made
    writer.close()
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(workdir, "final", params=False)[0] == 20
    # jaxformer's warnings: orbax's own (absl) says when a save waited over a second for the one before, as
    # the second save here may on a loaded machine.
    assert [record for record in caplog.records if record.levelno == logging.WARNING and record.name != "absl"] == []


def _cut_short(step_directory):
    """Damage orbax sees: the largest array data file cut to half its length."""
    data = max((step_directory / "state").rglob("ocdbt.process_0/d/*"), key=lambda path: path.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return "cannot restore the parameters of"


@pytest.mark.parametrize(
    "command, damage", [("evaluate", "array"), ("evaluate", "cut short"), ("translate", "array"), ("export", "array")]
)
def test_a_command_refuses_a_damaged_choice_in_one_line_before_its_work(
    command, damage, run, choose, tmp_path, capsys, monkeypatch
):
    from jaxformer.commands import evaluate
    from jaxformer.decoding.translator import Translator
    from jaxformer.export import exporter

    workdir, _ = run
    choose()
    final = RunDirectory(workdir).final
    if damage == "array":
        named = f"array {_wrong_array_checksum(final / '20')} does not match its checksum"
    else:
        named = _cut_short(final / "20")
    before = sorted(path.name for path in final.iterdir())

    def work(*args, **kwargs):
        pytest.fail("the command went on to its work with a damaged final choice")

    for module, name in ((evaluate, "split_pairs"), (Translator, "translate"), (exporter, "export_search")):
        monkeypatch.setattr(module, name, work)
    line = _refused_on_final(command, workdir, tmp_path, capsys)
    assert line.startswith(f"error: the final choice in {final} cannot be read: ") and named in line, line
    assert line.endswith(
        "running the run's training command again makes the choice again (it sets a damaged one aside)"
    )
    assert sorted(path.name for path in final.iterdir()) == before  # read only: the training command sets it aside
    assert not (tmp_path / "export").exists()


def _refused_on_final(command, workdir, tmp_path, capsys):
    """The one error line of `command` --checkpoint final on `workdir`, which exits with 2."""
    from jaxformer.commands import evaluate, export, translate

    text = tmp_path / "text"
    text.write_text("a\n")
    main, flags = {
        "evaluate": (evaluate.main, ["--split", "validation"]),
        "translate": (translate.main, ["--input", str(text)]),
        "export": (export.main, ["--output", str(tmp_path / "export"), "--platforms", "cpu"]),
    }[command]
    capsys.readouterr()
    assert main(["--workdir", str(workdir), "--checkpoint", "final", *flags]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    return line


@pytest.mark.parametrize("command", ["evaluate", "translate", "export"])
def test_final_of_a_run_that_has_not_chosen_names_what_makes_it(command, run, tmp_path, capsys):
    from jaxformer.errors import CheckpointError
    from jaxformer.run.loading import locate_checkpoint

    workdir, _ = run  # stopped before its end, or before its choice: checkpoints, no final/
    line = _refused_on_final(command, workdir, tmp_path, capsys)
    final = RunDirectory(workdir).final
    said = (  # was "... does not exist: no 'final' checkpoint in <workdir>" alone
        f"{final} does not exist: no 'final' checkpoint in {workdir}: the run has made no final choice; its training "
        "command, run again with training.final_choice=True (as multi30k sets it), makes it at the run's end"
    )
    assert line == f"error: {said}"
    with pytest.raises(CheckpointError) as error:  # training.init_from's checkpoint, the same
        locate_checkpoint(workdir, "final")
    assert str(error.value) == said.replace(str(workdir), str(workdir.absolute()))


FAST = ["--method", "greedy", "--max_extra_length", "6"]


def _array_file_removed(step_directory):
    max((step_directory / "state").rglob("ocdbt.process_0/d/*"), key=lambda path: path.stat().st_size).unlink()
    return "cannot restore the parameters of"


def _array_index_removed(step_directory):
    (step_directory / "state" / "_METADATA").unlink()
    return "the index of its arrays (its _METADATA file"


DAMAGE = {
    "cut short": _cut_short,
    "array file removed": _array_file_removed,
    "array index removed": _array_index_removed,
    "array checksum": lambda step: f"array {_wrong_array_checksum(step)} does not match its checksum",
}


def _pair_files(tmp_path):
    source, reference = tmp_path / "test.en", tmp_path / "test.de"
    source.write_text("A man sleeps.\nTwo dogs run.\n")
    reference.write_text("Ein Mann schläft.\nZwei Hunde rennen.\n")
    return ["--source", str(source), "--reference", str(reference)]


@pytest.mark.parametrize("data", ["split", "files"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_step_is_refused_in_one_line_before_the_data_is_read(
    damage, data, run, tmp_path, capsys, monkeypatch
):
    from jaxformer.commands import evaluate

    workdir, _ = run
    step = RunDirectory(workdir).checkpoints / "20"
    named = DAMAGE[damage](step)

    def read(*args, **kwargs):
        pytest.fail("the data was read before the checkpoint")

    monkeypatch.setattr(evaluate, "split_pairs", read)
    monkeypatch.setattr(evaluate, "file_pairs", read)
    flags = ["--split", "validation"] if data == "split" else _pair_files(tmp_path)
    capsys.readouterr()
    assert evaluate.main(["--workdir", str(workdir), "--checkpoint", "20", *flags, *FAST]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert named in line and str(step) in line, line


def counted_reads(monkeypatch):
    """What a command reads, counted: checkpoint metadata parsed, tokenizers parsed, and the folder
    of each parameters' read."""
    reads = {"metadata": 0, "tokenizers": 0, "parameters": []}
    from_json, tokenizer, restore = CheckpointMetadata.from_json, Tokenizer.__init__, Checkpointer._restore_params

    def metadata_read(*args):
        reads["metadata"] += 1
        return from_json(*args)

    def tokenizer_parsed(self, *args):
        reads["tokenizers"] += 1
        return tokenizer(self, *args)

    def parameters_read(self, *args):
        reads["parameters"].append(self.directory)
        return restore(self, *args)

    monkeypatch.setattr(CheckpointMetadata, "from_json", staticmethod(metadata_read))
    monkeypatch.setattr(Tokenizer, "__init__", tokenizer_parsed)
    monkeypatch.setattr(Checkpointer, "_restore_params", parameters_read)
    return reads


def _final_choice(workdir, params, step):
    writer = Checkpointer(RunDirectory(workdir).final, keep=None)
    metadata = load_checkpoint(workdir, 20, params=False)[1]
    writer.save_params(step, params, metadata.replace(step=step, chosen_from="latest", bleu=1.0))
    writer.close()


# The searches a command runs: greedy (FAST), beam search named, and the one final/ records (beam).
SEARCHES = {"greedy": FAST, "beam": ["--method", "beam", "--max_extra_length", "6"], "unnamed": []}


@pytest.mark.parametrize("command", ["evaluate", "translate"])
@pytest.mark.parametrize("checkpoint", ["final", "20"])
@pytest.mark.parametrize("search", SEARCHES)
def test_a_command_reads_the_checkpoint_once(command, checkpoint, search, run, tmp_path, capsys, monkeypatch):
    from jaxformer.commands import evaluate, translate
    from jaxformer.decoding.translator import Translator

    workdir, params = run
    _final_choice(workdir, params, 20)
    reads = counted_reads(monkeypatch)
    monkeypatch.setattr(Translator, "translate", lambda self, sentences, **kwargs: ["Ein Mann."] * len(sentences))
    arguments = ["--workdir", str(workdir), "--checkpoint", checkpoint, *SEARCHES[search]]
    if command == "evaluate":
        assert evaluate.main([*arguments, *_pair_files(tmp_path)]) == 0
        assert "2 sentences, step 20" in capsys.readouterr().out
    else:
        source, output = _pair_files(tmp_path)[1], tmp_path / "output.de"
        assert translate.main([*arguments, "--input", source, "--output", str(output)]) == 0
        assert output.read_text() == "Ein Mann.\nEin Mann.\n"
    # Not a second read for the translator (final/ was read whole as it was checked, then again), nor
    # of the metadata for the checks before the data or the parameters (translate read it for the model,
    # then for final/'s search, then whole); one tokenizer (a shared vocabulary) says what is empty to
    # the model and translates (each was parsed three times).
    folder = RunDirectory(workdir).final if checkpoint == "final" else RunDirectory(workdir).checkpoints
    assert reads == {"metadata": 1, "tokenizers": 1, "parameters": [folder]}


def test_evaluate_refuses_a_search_from_the_metadata_after_saying_the_run_trained_past_its_choice(
    run, tmp_path, capsys, monkeypatch
):
    from jaxformer.commands import evaluate

    workdir, params = run
    _final_choice(workdir, params, 10)
    reads = counted_reads(monkeypatch)
    arguments = ["--workdir", str(workdir), "--checkpoint", "final", *_pair_files(tmp_path)]
    assert evaluate.main([*arguments, "--method", "sample", "--top_k", "100000"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "was made at step 10, and the run trained past it, to step 20" in lines[-2]
    assert lines[-1].startswith("error: top_k=100000 is more than the model's ")
    assert reads == {"metadata": 1, "tokenizers": 0, "parameters": []}  # refused before the parameters are read
