"""A flag that holds one value, given twice, is one error naming both values (argparse kept the
last one unseen: `--config tiny --config multi30k` trained multi30k); flags that only switch
something on, and repeatable ones, may come again."""

import pytest

from benchmarks import command_line as benchmark_command_line
from benchmarks import translate_time
from jaxformer.commands import evaluate, train, translate
from jaxformer.commands.common import make_parser


def refusal(main, argv, capsys) -> str:
    """The one error line `main(argv)` prints, checked to exit 2 (argparse's exit, or train.py's
    return: it reports its command line's errors itself, in every process of a run) with nothing on stdout."""
    try:
        code = main(argv)
    except SystemExit as stopped:
        code = stopped.code
    assert code == 2
    captured = capsys.readouterr()
    assert not captured.out and captured.err.count("\n") == 1, captured
    return captured.err


def test_train_refuses_a_second_config(capsys):
    error = refusal(train.main, ["--config", "tiny", "--config", "multi30k", "--print_config"], capsys)
    assert error == (
        f"error: argument --config: given twice ('tiny', then 'multi30k'); see {train.build_parser().prog} --help\n"
    )


@pytest.mark.parametrize(
    "repeated",
    [
        ["--workdir", "a", "--workdir", "b"],
        ["--workdir=a", "--workdir", "b"],
        ["--work", "a", "--workdir=b"],  # an abbreviation is the same flag
        ["--workdir", "a", "--workdir", "a"],  # the same value twice is a slip too
    ],
)
def test_train_refuses_a_second_workdir_in_any_spelling(repeated, capsys):
    error = refusal(train.main, ["--config", "tiny", *repeated, "--print_config"], capsys)
    assert error.startswith("error: argument --workdir: given twice ('a', then '")


def test_translate_and_evaluate_refuse_a_second_beam_size(tmp_path, capsys):
    flags = ["--workdir", str(tmp_path), "--beam_size", "4", "--beam_size=5"]
    assert "error: argument --beam_size: given twice (4, then 5); see " in refusal(translate.main, flags, capsys)
    assert "argument --beam_size: given twice (4, then 5)" in refusal(evaluate.main, flags, capsys)


def test_config_overrides_and_switches_given_twice_still_work(capsys):
    argv = ["--config", "tiny", "--config.training.seed=7", "--print_config", "--verbose", "--verbose"]
    assert train.main(argv) == 0
    assert "seed: 7" in capsys.readouterr().out


def test_defaults_do_not_count_and_each_parse_starts_afresh():
    parser = make_parser("a test")
    parser.add_argument("--name", default="default")
    parser.add_argument("--size", type=int, default=3)
    assert vars(parser.parse_args(["--name", "a"])) == {"verbose": False, "name": "a", "size": 3}
    assert vars(parser.parse_args(["--name", "b", "--size", "4"])) == {"verbose": False, "name": "b", "size": 4}
    known, rest = parser.parse_known_args(["--name", "c", "--other"])
    assert known.name == "c" and rest == ["--other"]


def test_the_benchmarks_refuse_a_second_value_and_keep_repeatable_flags(tmp_path, capsys):
    arguments = benchmark_command_line.parser("xla_options", "A benchmark.")
    arguments.add_argument("--option", action="append", default=None)
    error = refusal(arguments.parse_args, ["--iters", "2", "--iters", "3"], capsys)
    assert error == "error: argument --iters: given twice (2, then 3); see python -m benchmarks.xla_options --help\n"
    assert arguments.parse_args(["--option", "a", "--option", "b"]).option == ["a", "b"]
    flags = ["--workdir", str(tmp_path), "--rounds", "1", "--rounds", "2"]
    assert "error: argument --rounds: given twice (1, then 2)" in refusal(translate_time.main, flags, capsys)
