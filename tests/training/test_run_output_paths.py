"""A file, folder or link where a new training run writes (best/, final/, its metrics, its
tokenizers, its TensorBoard events) is one line at its start, before any data is prepared (the
no_data fixture), the workdir left as it was."""

import pytest

from jaxformer.commands import train
from jaxformer.errors import EXIT_USER_ERROR, CheckpointError
from jaxformer.run.directory import RunDirectory


@pytest.mark.parametrize("folder, holds", [("best", "best checkpoints"), ("final", "final choices")])
def test_a_file_where_a_fresh_run_saves_is_one_line_before_any_work(folder, holds, tmp_path, capsys, no_data):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / folder).write_text("junk\n")
    argv = [
        "--config",
        "tiny",
        "--workdir",
        str(workdir),
        "--config.training.final_choice=True",
        "--config.training.average_last=3",
    ]
    assert train.main([*argv, "--config.training.bleu_every_steps=20"]) == EXIT_USER_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {workdir / folder} is not a directory, where the {holds} go: move it away"]
    assert sorted(path.name for path in workdir.iterdir()) == [folder]  # nothing added, nothing lost
    assert (workdir / folder).read_text() == "junk\n"


SEPARATE = ["--config.tokenizer.separate_vocabularies=True", "--config.model.share_embeddings=False"]
# The files a run writes, what it writes there, and the flags that make it write the file.
WRITTEN = [
    ("metrics.jsonl", "writes its metrics", []),
    ("metrics.rolled_back.jsonl", "writes its metrics", []),
    ("last_metrics.json", "writes its metrics", []),
    ("tokenizer.model", "saves its tokenizer", []),
    ("tokenizer.target.model", "saves its tokenizer", SEPARATE),
]


@pytest.mark.parametrize("name, purpose, flags", WRITTEN)
def test_a_folder_where_a_run_writes_a_file_is_one_line_before_any_work(
    name, purpose, flags, tmp_path, capsys, no_data
):
    """Else found by a traceback: metrics.jsonl's as the first step is written, metrics.rolled_back.jsonl's
    once a resumed run has restored its state and moves the records of the steps it trains again there,
    last_metrics.json's once every step is trained (a sweep's variant too: jaxformer-sweep reads it
    before any trains); a tokenizer's in one line, but once the data was prepared."""
    workdir = tmp_path / "run"
    (workdir / name).mkdir(parents=True)
    assert train.main(["--config", "tiny", "--workdir", str(workdir), *flags]) == EXIT_USER_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {workdir / name} is a folder, where the run {purpose}: move it away"]
    assert sorted(path.name for path in workdir.iterdir()) == [name]  # nothing added, nothing lost


@pytest.mark.parametrize("name, purpose, flags", WRITTEN)
def test_a_link_into_no_folder_where_a_run_writes_a_file_is_one_line_before_any_work(
    name, purpose, flags, tmp_path, capsys, no_data
):
    """Written through the link, it was a FileNotFoundError traceback: metrics.jsonl's at the first
    record, last_metrics.json's once every step was trained, a tokenizer's once it was trained. A link
    into a folder that exists is written."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / name).symlink_to(tmp_path / "gone" / name)
    assert train.main(["--config", "tiny", "--workdir", str(workdir), *flags]) == EXIT_USER_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {workdir / name} is a link to {tmp_path / 'gone' / name}, in a folder that does not exist, "
        f"where the run {purpose}: move it away"
    ]
    assert sorted(path.name for path in workdir.iterdir()) == [name]  # nothing added, nothing lost


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_a_file_where_a_run_writes_its_tensorboard_events_is_one_line_before_any_work(kind, tmp_path, capsys, no_data):
    """Else a FileExistsError traceback (exit 1) once the data, the tokenizers and the model were ready."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    events = workdir / "tensorboard"
    events.write_text("junk\n") if kind == "file" else events.symlink_to(tmp_path / "nowhere")
    assert train.main(["--config", "tiny", "--workdir", str(workdir)]) == EXIT_USER_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {events} is not a directory, where the run writes its TensorBoard events: move it away"]
    assert sorted(path.name for path in workdir.iterdir()) == ["tensorboard"]  # nothing added, nothing lost
    assert events.is_symlink() or events.read_text() == "junk\n"


def test_only_the_folders_a_run_uses_are_checked(tmp_path):
    run = RunDirectory(tmp_path)
    (tmp_path / "final").write_text("a file of mine")
    (tmp_path / "best").symlink_to(tmp_path / "nowhere")
    run.check_folders("latest", "averaged")  # absent: fine
    with pytest.raises(CheckpointError, match=r"/best is not a directory, where the best checkpoints go"):
        run.check_folders("latest", "best", "final")  # a dangling link too
