"""The benchmarks' command lines: a bad value, an unknown or contradictory flag, or a --json file
that cannot be written is one line, `error: ...`, and exit status 2, before anything is compiled
or timed; nothing is silently replaced. And their --help and README say what is true."""

import gzip
import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks import command_line, common

README = pathlib.Path(common.__file__).with_name("README.md").read_text(encoding="utf-8")
WITH_TORCH = ("train_step", "real_data", "decoding", "step_profile")
WITHOUT_TORCH = ("scaling", "memory_options", "input_pipeline", "step_options", "xla_options", "precision")
BENCHMARKS = WITH_TORCH + WITHOUT_TORCH
RUN, TIME_INTERLEAVED = subprocess.run, common.time_interleaved  # the no_work fixture forbids them
# Imported before the no_work fixture patches anything, so that no module binds its stand-ins.
MODULES = {name: importlib.import_module(f"benchmarks.{name}") for name in (*BENCHMARKS, "translate_time")}


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Any compilation or timing fails the test: the errors must come before them."""

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the command line was checked")

    monkeypatch.setattr(common, "time_interleaved", forbidden)
    monkeypatch.setattr(common, "compile_timed", forbidden)
    monkeypatch.setattr(common, "make_train", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)  # translate_time's processes
    for module in MODULES.values():
        for attribute in ("time_interleaved", "compile_timed", "make_train", "time_calls", "time_train_steps"):
            if hasattr(module, attribute):
                monkeypatch.setattr(module, attribute, forbidden)


def refused(name, argv, capsys) -> str:
    """The one line benchmark `name` prints for `argv`, checked to exit 2 with nothing on stdout."""
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"benchmarks.{name}").main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err and not captured.out
    assert f"see python -m benchmarks.{name} --help" in lines[0]
    return lines[0]


# (benchmark, argv, fragments the error line must hold)
BAD_VALUES = [
    ("decoding", ["--smoke", "--searches", "foo"], ["--searches", "'foo'", "greedy, beam"]),
    ("decoding", ["--smoke", "--searches", "greedy,greedy"], ["--searches", "'greedy' is given twice"]),
    ("decoding", ["--batch-sizes", "x"], ["--batch-sizes", "'x'"]),
    (
        "decoding",
        ["--library", "--length", "8", "--source-length", "8"],
        ["--length", "with --library, must exceed --source-length (8)", "got 8"],
    ),
    ("decoding", ["--batch-sizes", "0"], ["--batch-sizes", ">= 1", "got 0"]),
    ("decoding", ["--batch-sizes", "1,,2"], ["--batch-sizes", "'1,,2'"]),
    ("decoding", ["--length", "0"], ["--length", "got 0"]),
    ("decoding", ["--source-length", "0"], ["--source-length", "got 0"]),
    ("decoding", ["--smoke", "--torch", "--searches", "beam"], ["--torch", "greedy"]),
    ("scaling", ["--lengths", "x"], ["--lengths", "'x'"]),
    ("scaling", ["--lengths", "0"], ["--lengths", "got 0"]),
    ("scaling", ["--batch", "0"], ["--batch", "got 0"]),
    ("scaling", ["--tokens", "0"], ["--tokens", "got 0"]),
    ("train_step", ["--configs", "foo"], ["--configs", "'foo'", "tiny, small, base, multi30k"]),
    ("train_step", ["--configs", ""], ["--configs", "''"]),
    ("step_options", ["--configs", "foo"], ["--configs", "'foo'"]),
    ("step_profile", ["--configs", "foo"], ["--configs", "'foo'"]),
    ("step_profile", ["--profile-steps", "0"], ["--profile-steps", "got 0"]),
    ("memory_options", ["--options", "plain,nosuch"], ["--options", "'nosuch' is not one of plain, remat_full"]),
    ("memory_options", ["--smoke", "--layers", "2"], ["--layers", "not allowed with argument --smoke"]),
    ("memory_options", ["--batch", "0"], ["--batch", "got 0"]),
    ("xla_options", ["--config", "nosuch"], ["--config", "nosuch"]),
    ("xla_options", ["--option", "bad"], ["--option", "'bad'", "NAME=KEY:VALUE"]),
    ("xla_options", ["--option", "default=a:1"], ["--option", "`default` is the row without options"]),
    ("xla_options", ["--option", "a=b:1", "--option", "a=c:2"], ["--option", "'a' is given twice"]),
    ("xla_options", ["--devices", "0"], ["--devices", "got 0"]),
    (  # 3 devices cannot split tiny's 4 rows: found before any row's step compiles
        "xla_options",
        ["--config", "tiny", "--devices", "3"],
        ["--devices", "3, row 'data_parallel_3'", "data.batch_size=4 must be divisible by the 3 data-parallel"],
    ),
    (  # an option XLA does not know: found on a scalar function, before the train steps compile
        "xla_options",
        ["--smoke", "--devices", "1", "--option", "bad=xla_no_such_option:true"],
        ["--option", "row 'bad'", "No such compile option: 'xla_no_such_option'"],
    ),
    ("input_pipeline", ["--steps", "0"], ["--steps", "got 0"]),
    ("precision", ["--batches", "0"], ["--batches", "got 0"]),
    ("precision", ["--configs", "tiny,nosuch"], ["--configs", "'nosuch'", "tiny, small, base, multi30k"]),
    ("real_data", ["--pairs", "0"], ["--pairs", "got 0"]),
    ("real_data", ["--pairs", "1000000"], ["--pairs", "1000000", "training pairs"]),
    ("real_data", ["--repeats", "2", "--iters", "2"], ["--repeats", "--iters"]),
    (  # 1 of 64 pairs within 16 tokens: a packed batch of 4 rows would repeat it
        "real_data",
        ["--pairs", "64", "--batch-size", "4", "--max-length", "16", "--vocab-size", "300"],
        ["--pairs", "1 pairs of the slice have both sides within 16 tokens", "one packed batch of 4 rows"],
    ),
    ("train_step", ["--iters", "0"], ["--iters", "got 0"]),
    ("train_step", ["--iters", "-3"], ["--iters", "got -3"]),
    ("train_step", ["--budget-s", "-1"], ["--budget-s", "-1"]),
    ("scaling", ["--tokens", "4096", "--batch", "8"], ["--batch", "not allowed with argument --tokens"]),
    ("train_step", ["--overwrite"], ["--overwrite", "--json"]),
]


@pytest.mark.parametrize("name, argv, fragments", BAD_VALUES, ids=[" ".join([n, *a]) for n, a, _ in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_it(name, argv, fragments, capsys):
    line = refused(name, argv, capsys)
    for fragment in fragments:
        assert fragment in line


@pytest.mark.parametrize("name", WITHOUT_TORCH)
@pytest.mark.parametrize("flag", [["--torch"], ["--torch-threads", "1"]])
def test_benchmarks_that_time_no_torch_refuse_the_torch_flags(name, flag, capsys):
    assert f"unrecognized arguments: {' '.join(flag)}" in refused(name, ["--smoke", *flag], capsys)


@pytest.mark.parametrize("name", WITH_TORCH)
def test_torch_threads_without_torch_is_refused(name, capsys):
    assert "argument --torch-threads: only with --torch" in refused(name, ["--smoke", "--torch-threads", "1"], capsys)


@pytest.mark.parametrize("name", WITH_TORCH)
def test_torch_threads_are_at_least_one(name, capsys):
    assert "argument --torch-threads: must be an integer >= 1, got 0" in refused(
        name, ["--smoke", "--torch-threads", "0"], capsys
    )


SMOKE_SETS = [
    ("train_step", ["--configs", "tiny"]),
    ("step_options", ["--configs", "tiny"]),
    ("step_profile", ["--configs", "tiny"]),
    ("decoding", ["--batch-sizes", "1"]),
    ("decoding", ["--length", "8"]),
    ("decoding", ["--source-length", "8"]),
    ("scaling", ["--lengths", "8"]),
    ("scaling", ["--tokens", "64"]),
    ("xla_options", ["--config", "tiny"]),
    ("precision", ["--configs", "tiny"]),
    ("precision", ["--batches", "2"]),
    ("real_data", ["--pairs", "48"]),
    ("real_data", ["--batch-size", "4"]),
    ("real_data", ["--max-length", "32"]),
    ("real_data", ["--vocab-size", "300"]),
    ("memory_options", ["--layers", "2"]),
    ("memory_options", ["--batch", "4"]),
    ("memory_options", ["--length", "8"]),
]


@pytest.mark.parametrize("name, flag", SMOKE_SETS, ids=[" ".join([n, *f]) for n, f in SMOKE_SETS])
def test_smoke_refuses_the_flags_it_sets_itself(name, flag, capsys):
    line = refused(name, ["--smoke", *flag], capsys)
    assert f"argument {flag[0]}: not allowed with argument --smoke" in line


def test_readme_names_every_flag_smoke_refuses():
    (smoke_row,) = [line for line in README.splitlines() if line.startswith("| `--smoke` |")]
    assert [flag for _, (flag, _) in SMOKE_SETS if f"`{flag}`" not in smoke_row] == []


def test_json_is_checked_before_any_work(tmp_path, capsys):
    existing = tmp_path / "rows.jsonl"
    existing.write_text("kept\n")
    line = refused("train_step", ["--smoke", "--json", str(existing)], capsys)
    assert f"--json {existing}: already exists; pass --overwrite" in line
    assert existing.read_text() == "kept\n"
    line = refused("scaling", ["--smoke", "--json", str(tmp_path / "missing" / "x.json")], capsys)
    assert "the folder" in line and "does not exist" in line
    assert "is a directory" in refused("decoding", ["--smoke", "--json", str(tmp_path)], capsys)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "cannot write in" in refused("xla_options", ["--smoke", "--json", str(locked / "x.json")], capsys)


def test_overwrite_lets_json_replace_a_file(tmp_path):
    existing = tmp_path / "rows.jsonl"
    existing.write_text("old\n")
    args = command_line.parse_args(command_line.parser("x", "Doc."), ["--json", str(existing), "--overwrite"])
    assert args.json == str(existing) and args.overwrite
    args = command_line.parse_args(command_line.parser("x", "Doc."), ["--json", str(tmp_path / "new.jsonl")])
    assert not args.overwrite


def test_flags_smoke_does_not_set_keep_their_defaults_and_values():
    arguments = command_line.parser("x", "Doc.")
    arguments.add_argument("--configs", type=command_line.names(("a", "b")), default=None)
    assert command_line.parse_args(arguments, [], {"configs": ["a"]}).configs == ["a"]
    assert command_line.parse_args(arguments, ["--configs", "b,a"], {"configs": ["a"]}).configs == ["b", "a"]
    assert command_line.parse_args(arguments, ["--smoke"], {"configs": ["a"]}).configs == ["a"]  # unused by --smoke


def test_time_interleaved_refuses_no_rounds():
    with pytest.raises(ValueError, match="iters must be >= 1, got 0"):
        TIME_INTERLEAVED({"call": lambda: 0}, 0)


def test_decoding_searches_only_greedy_and_beam():
    from benchmarks import decoding

    with pytest.raises(ValueError, match="'foo'"):
        decoding._search(None, None, 1, "foo", 4)


def help_description(name, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"benchmarks.{name}").main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    return " ".join(text.split("\n\n")[1].split())  # after the usage lines, before the options


@pytest.mark.parametrize("name", BENCHMARKS)
def test_help_describes_the_benchmark_in_whole_sentences(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    first_paragraph = " ".join(module.__doc__.split("\n\n")[0].split())
    description = help_description(name, capsys)
    assert description == first_paragraph and description.endswith(".")


def test_a_docstrings_first_sentence_over_two_lines_is_whole():
    assert command_line.summary("One sentence\nover two lines.\n\n    usage\n") == "One sentence over two lines."


def test_translate_time_checks_its_files_and_counts_first(tmp_path, capsys):
    workdir = str(tmp_path)
    line = refused("translate_time", ["--workdir", workdir, "--input", str(tmp_path / "missing")], capsys)
    assert f"--input {tmp_path / 'missing'}: no such file" in line
    assert "--rounds" in refused("translate_time", ["--workdir", workdir, "--rounds", "0"], capsys)
    assert "--beam_size" in refused("translate_time", ["--workdir", workdir, "--beam_size", "0"], capsys)
    line = refused("translate_time", ["--workdir", str(tmp_path / "nosuch")], capsys)
    assert "--workdir" in line and "no such directory" in line
    existing = tmp_path / "rows.jsonl"
    existing.write_text("kept\n")
    assert "already exists" in refused("translate_time", ["--workdir", workdir, "--json", str(existing)], capsys)
    line = refused("translate_time", ["--workdir", str(existing)], capsys)  # a file
    assert f"--workdir {existing}: not a directory" in line
    line = refused("translate_time", ["--workdir", workdir, "--checkpoint", "nosuch"], capsys)
    assert "argument --checkpoint: must be latest, best, averaged, final or a step number, got 'nosuch'" in line
    (tmp_path / "checkpoints").mkdir()  # a workdir without that checkpoint: found before any process runs
    assert "holds no checkpoint" in refused("translate_time", ["--workdir", workdir, "--checkpoint", "9"], capsys)
    assert f"{tmp_path / 'best'} does not exist" in refused(
        "translate_time", ["--workdir", workdir, "--checkpoint", "best"], capsys
    )


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("latin1.txt", "caf\xe9\n".encode("latin-1"), "line 1 is not valid UTF-8"),
        ("cut.txt.gz", gzip.compress(b"a sentence\n", mtime=0)[:-8], "not a complete gzip file"),
        ("empty.txt", b"", "--input {path}: no lines to translate"),
    ],
)
def test_translate_time_refuses_an_unreadable_input_in_one_line(name, content, reason, tmp_path, monkeypatch, capsys):
    """An --input that exists but does not decode, or holds no line, is one line naming it and why,
    before any process."""
    from jaxformer.run import loading

    monkeypatch.setattr(loading, "load_checkpoint", lambda *args, **kwargs: None)  # a run's checkpoint, found
    unreadable = tmp_path / name
    unreadable.write_bytes(content)
    line = refused("translate_time", ["--workdir", str(tmp_path), "--input", str(unreadable)], capsys)
    assert f"{unreadable}: " in line and reason.format(path=unreadable) in line, line


@pytest.mark.parametrize("name", [*BENCHMARKS, "translate_time"])
def test_readme_has_a_section_naming_every_column(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert f"\n## {name}\n" in README
    section = README.split(f"\n## {name}\n")[1].split("\n## ")[0]
    assert [column for column in module.COLUMNS if f"`{column}`" not in section] == []


def test_readme_sizes_are_the_configs_and_only_multi30k_is_called_multi30ks_model():
    rows = {match[0]: match[1] for match in re.findall(r"^\| `(\w+)` \| ([^|]*) \|", README, re.MULTILINE)}
    for name, make in common.CONFIGS.items():
        config = make()[0]
        assert name in rows, name
        if name in ("small", "multi30k"):  # tiny and base are named by their presets
            assert f"d {config.d_model}," in rows[name] and f"d_ff {config.d_ff}" in rows[name], name
        assert ("multi30k.py's model" in rows[name]) == (name == "multi30k"), name


def test_real_data_help_gives_multi30ks_vocabulary_as_it_is(capsys):
    from benchmarks import real_data
    from jaxformer.configs import multi30k

    with pytest.raises(SystemExit):
        real_data.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    tokenizer = multi30k.get_config().tokenizer
    assert tokenizer.separate_vocabularies
    assert f"multi30k.py has {tokenizer.vocab_size} per language, separate vocabularies" in text


@pytest.mark.slow  # about 9 s of torch profiling, for the benchmark's printed table only
def test_torch_profiles_print_no_profiler_lines():
    pytest.importorskip("torch")
    code = (
        "import torch\n"
        "from benchmarks.step_profile import profile_torch\n"
        "profile_torch(lambda: torch.ones(3) + 1, 1)\n"
        "print('profiled')\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("KINETO_")}
    result = RUN(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=pathlib.Path(common.__file__).parents[1],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "profiled"
    assert "USDT" not in result.stderr and "profiler_start" not in result.stderr


def test_a_translators_sizes_as_a_language_model_keep_one_embedding():
    from benchmarks.common import CONFIGS
    from benchmarks.train_step import as_architecture

    config, *_ = CONFIGS["multi30k"]()  # separate vocabularies, untied source embedding
    assert not config.share_embeddings
    language_model = as_architecture(config, "decoder_only")
    assert language_model.share_embeddings and language_model.source_vocab_size is None
    assert (language_model.vocab_size, language_model.d_model) == (config.vocab_size, config.d_model)
    assert as_architecture(config, "encoder_decoder") == config


def test_train_step_footnotes_give_each_configs_own_dropout():
    from benchmarks.common import CONFIGS
    from benchmarks.train_step import settings

    setups = [(name, *CONFIGS[name]()) for name in ("tiny", "multi30k")]
    assert setups[0][1].dropout_rate != setups[1][1].dropout_rate  # 0.1 against 0.15
    lines = settings(setups, with_torch=False, torch_threads=None)
    for name, config, *_ in setups:
        (line,) = [line for line in lines if line.startswith(f"  {name}: ")]
        assert f"dropout {config.dropout_rate} " in line, line
    assert "separate source embedding (6000 pieces)" in lines[-1]
    assert "dropout" not in lines[0]  # the rows' shared settings name no one config's dropout
    (alike,) = [line for line in settings(setups[:1], with_torch=False, torch_threads=None) if "dropout" in line]
    assert alike.startswith("settings: ")  # one config: its model settings with the shared ones


def test_xla_options_default_devices_are_the_cores_this_process_may_run_on(monkeypatch, capsys):
    """In a container or under taskset the machine has more cores than the process may use: the
    default data-parallel row takes the process's (3 here: tiny's 4 rows refuse them by name)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    line = refused("xla_options", ["--config", "tiny"], capsys)
    assert "argument --devices: 3 (the default: the cores this process may run on), row 'data_parallel_3'" in line
