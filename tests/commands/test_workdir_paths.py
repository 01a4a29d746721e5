"""A workdir that cannot be made (a file there or on the way, a folder that takes no new entries)
is one error line naming it and why, before any work: jaxformer-sweep's was mkdir's traceback, and
jaxformer-train's said "File exists" of a file."""

import pytest

from jaxformer.commands import sweep, train
from tests.training.test_sweep import SHARED, TINY, write_sweep


def one_error_line(main, argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert not captured.out and captured.err.count("\n") == 1, captured.err[-2000:]
    return captured.err


@pytest.mark.parametrize("under_a_file", [False, True])
def test_a_sweep_workdir_that_cannot_be_made_is_one_line(under_a_file, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    workdir = tmp_path / "afile" / "sweep" if under_a_file else tmp_path / "afile"
    sweep_file = write_sweep(tmp_path / "one.py", {"a": ["training.seed=1"]})
    argv = ["--config", TINY, "--sweep", str(sweep_file), "--workdir", str(workdir), *SHARED]
    error = one_error_line(sweep.main, argv, capsys)
    on_the_way = f"{tmp_path / 'afile'} " if under_a_file else ""
    assert error == f"error: --workdir {workdir}: {on_the_way}is a file, not a folder\n"
    assert (tmp_path / "afile").read_text() == "x"


def test_a_sweep_workdir_where_nothing_can_be_made_is_one_line(tmp_path, capsys):
    sweep_file = write_sweep(tmp_path / "one.py", {"a": ["training.seed=1"]})
    argv = ["--config", TINY, "--sweep", str(sweep_file), "--workdir", "/proc/jaxformer/sweep", *SHARED]
    error = one_error_line(sweep.main, argv, capsys)
    assert error.startswith("error: --workdir /proc/jaxformer/sweep: /proc takes no new entries (")


def test_a_train_workdir_that_is_a_file_is_named_as_one(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    argv = ["--config", "tiny", "--workdir", str(tmp_path / "afile"), "--config.training.num_train_steps=1"]
    error = one_error_line(train.main, argv, capsys)
    assert error == f"error: cannot create the workdir {tmp_path / 'afile'}: is a file, not a folder\n"
    assert (tmp_path / "afile").read_text() == "x"
