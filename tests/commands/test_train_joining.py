"""An error of train.py's own command line in one process of a multi-process run: the process joins
the run first and raises it in every process, as a config error is, where it exited alone and the
others waited 5 minutes for it, then aborted (exit 134). The real two-process run:
tests/training/test_distributed.py."""

import pytest

from jaxformer.commands import train
from jaxformer.training import processes

PROG = train.build_parser().prog  # sys.argv[0]
LAUNCH = ["--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=1"]


@pytest.fixture
def calls(monkeypatch):
    """What the command did, in order: joined the run, then met the error in `all_or_none`."""
    done = []
    monkeypatch.setattr(train, "join_processes", lambda args: done.append(("join", args.process_id)))

    def all_or_none(step):
        try:
            return step()
        except Exception as error:
            done.append(("all_or_none", str(error)))
            raise

    monkeypatch.setattr(processes, "all_or_none", all_or_none)
    return done


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--config.data.max_length=16", "--config.data.max_length=16"],
            "config key 'data.max_length' is given twice, as '16' and as '16': keep one",
        ),
        (["--config.model.d_ff"], "--config.model.d_ff has no value (write --config.model.d_ff=VALUE)"),
        (["--bogus"], f"unrecognized arguments: --bogus; see {PROG} --help"),
        (["--num_train_steps", "x"], f"unrecognized arguments: --num_train_steps x; see {PROG} --help"),
        (["--workdir", "w2"], f"argument --workdir: given twice ('w', then 'w2'); see {PROG} --help"),
    ],
)
def test_command_line_errors_join_the_run_before_they_are_raised(arguments, message, calls, capsys):
    code = train.main(["--config", "tiny", "--workdir", "w", *LAUNCH, *arguments])
    assert code == 2
    assert calls == [("join", 1), ("all_or_none", message)]
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {message}"


def test_a_missing_workdir_joins_the_run_too(calls, capsys):
    assert train.main(["--config", "tiny", *LAUNCH]) == 2
    message = f"the following arguments are required: --workdir; see {PROG} --help"
    assert calls == [("join", 1), ("all_or_none", message)]
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {message}"


@pytest.mark.parametrize(
    "launch",
    [
        [],  # one process: nobody to tell
        ["--print_config"],  # --print_config joins no run
        ["--coordinator_address=127.0.0.1:1234", "--num_processes=2"],  # cannot join: no --process_id
        ["--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=x"],
        [*LAUNCH, "--process_id=0"],  # a launch flag given twice
    ],
)
def test_command_lines_that_join_no_run_report_at_once(launch, calls, capsys):
    assert train.main(["--config", "tiny", "--workdir", "w", *launch, "--config.model.d_ff"]) == 2
    assert calls == []
    assert (
        capsys.readouterr().err.strip() == "error: --config.model.d_ff has no value (write --config.model.d_ff=VALUE)"
    )
