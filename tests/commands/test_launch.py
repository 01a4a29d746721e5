"""A Ctrl-C while a command is still loading (importing jax, building its parser) ends it as a
later one does, `interrupted` and exit 130: no traceback of the module that was loading, and not
lost in jax's garbage-collector callback."""

import ast
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import tomllib

import pytest

ROOT = pathlib.Path(__file__).parents[2]

# A command whose loading takes `seconds` (argv[1]) and says when it has begun.
SLOW_COMMAND = """
import sys, time
sys.stderr.write("loading\\n")
sys.stderr.flush()
time.sleep(float(sys.argv[1]))
from jaxformer.commands import common

def main(argv=None):
    return common.run_command(common.make_parser(None), lambda args: print("ran") or 0, [])
"""

# Python's own Ctrl-C handler, as a terminal's process has it, whatever the test runner's process set.
LAUNCH = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from jaxformer.commands.launch import launch; sys.exit(launch('slow_command'))"
)


def start_and_interrupt(tmp_path, seconds, interrupts):
    (tmp_path / "slow_command.py").write_text(SLOW_COMMAND)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(seconds)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stderr.readline() == b"loading\n"
    start = time.monotonic()
    for _ in range(interrupts):
        process.send_signal(signal.SIGINT)
        time.sleep(0.2)
    output, error = process.communicate(timeout=60)
    return process.returncode, output.decode(), error.decode(), time.monotonic() - start


def test_a_ctrl_c_while_the_command_loads_ends_it_in_one_line_once_loaded(tmp_path):
    code, output, error, _ = start_and_interrupt(tmp_path, seconds=1, interrupts=1)
    assert (code, output, error) == (130, "", "interrupted\n")


def test_a_second_ctrl_c_while_it_loads_ends_it_at_once(tmp_path):
    code, output, error, seconds = start_and_interrupt(tmp_path, seconds=60, interrupts=2)
    assert (code, output, error) == (130, "", "interrupted\n")
    assert seconds < 30


def test_every_entry_point_is_launched():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert all(target.startswith("jaxformer.commands.launch:") for target in scripts.values()), scripts
    for name in ("train", "translate", "evaluate", "average_checkpoints"):
        assert f"from jaxformer.commands.launch import {name} as main\n" in (ROOT / f"{name}.py").read_text()
    loads = "import sys, jaxformer.commands.launch; print(sorted({'jax', 'numpy'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", loads], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"  # loaded before the Ctrl-C can come: nothing heavy


# A command that has finished with exit code argv[1], then takes a while to end: in an exit
# callback (argv[2] == "callback", as jax's clean-up) or as Python frees its modules (as jax's
# objects are); it says when it has begun.
FINISHED_COMMAND = """
import atexit, os, sys, time

class EndsSlowly:
    def __del__(self, write=os.write, sleep=time.sleep):
        write(2, b"ending\\n")
        sleep(2)

def main(argv=None):
    if sys.argv[2] == "callback":
        atexit.register(lambda: os.write(2, b"ending\\n") and time.sleep(2))
    else:
        globals()["ends_slowly"] = EndsSlowly()
    return int(sys.argv[1])
"""


# slow: exit code 0 (2 cases, about 4 s of processes); covered in the default suite by code 2 at the same two
# moments, whose kept code is neither 0 nor SIGTERM's 143.
@pytest.mark.parametrize("code", [pytest.param(0, marks=pytest.mark.slow), 2])
@pytest.mark.parametrize("when", ["callback", "teardown"])
def test_a_signal_after_the_command_finished_keeps_its_exit_code(tmp_path, code, when):
    """The work is done (an export in place): SIGTERM while Python exits is no stop, 143."""
    (tmp_path / "finished_command.py").write_text(FINISHED_COMMAND)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    launch = "import sys; from jaxformer.commands.launch import launch; sys.exit(launch('finished_command'))"
    process = subprocess.Popen(
        [sys.executable, "-c", launch, str(code), when], env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stderr.readline() == b"ending\n"
    process.send_signal(signal.SIGTERM)
    _, error = process.communicate(timeout=60)
    assert process.returncode == code
    said = f"SIGTERM came once the command's work was done; exiting with {code}\n" if when == "callback" else ""
    assert error.decode() == said


def test_python_dash_m_launches_every_command_before_its_imports():
    """`python -m jaxformer.commands.NAME` runs the module as `__main__`: its first statement after
    the docstring must hand it to launch, or jax loads before a Ctrl-C is kept."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    names = sorted(target.partition(":")[2] for target in scripts.values())
    commands = (ROOT / "jaxformer" / "commands").glob("*.py")
    assert names == sorted(path.stem for path in commands if "\ndef main(" in path.read_text())
    for name in names:
        body = ast.parse((ROOT / "jaxformer" / "commands" / f"{name}.py").read_text()).body
        first = next(
            node for node in body[1:] if not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        )
        assert ast.unparse(first) == (
            "if __name__ == '__main__':\n"
            "    from jaxformer.commands.launch import run_as_main\n"
            f"    run_as_main('jaxformer.commands.{name}')"
        ), name


def test_python_dash_m_names_the_command_in_its_usage():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-m", "jaxformer.commands.average_checkpoints", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.startswith(
        "usage: python -m jaxformer.commands.average_checkpoints "
    ), result.stdout[:200]


@pytest.mark.parametrize(
    "script, argv, expected",
    [
        (
            "translate.py",
            ["--bogus"],
            "error: the following arguments are required: --workdir; see python translate.py --help\n",
        ),
        (
            "train.py",
            ["--config", "tiny"],
            "error: the following arguments are required: --workdir; see python train.py --help\n",
        ),
    ],
)
def test_a_clones_script_names_itself_as_it_is_run(script, argv, expected):
    """`see translate.py --help` named no command a shell runs: `python translate.py` does, as
    `python -m` names its module."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, str(ROOT / script), *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout, result.stderr) == (2, "", expected)


def jax_is_loading(process):
    """Whether `process` has mapped jaxlib (Linux), so its launcher's Ctrl-C handler is in place."""
    try:
        return "jaxlib" in pathlib.Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return None


def test_a_ctrl_c_while_python_dash_m_loads_the_command_ends_it_in_one_line(tmp_path):
    """As its console script: `interrupted` and 130, whether the Ctrl-C comes while jax loads or,
    on a fast machine, once the command waits for its input (stdin, held open)."""
    (tmp_path / "checkpoints").mkdir()  # a workdir as far as the flags' checks go
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    for delay in (0.0, 0.5):
        process = subprocess.Popen(
            [sys.executable, "-m", "jaxformer.commands.translate", "--workdir", str(tmp_path)],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Python's own handler, as a terminal's
        )
        deadline = time.monotonic() + 60
        while jax_is_loading(process) is False and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay if jax_is_loading(process) else delay + 0.5)
        process.send_signal(signal.SIGINT)
        output, error = process.communicate(timeout=60)
        assert (process.returncode, output, error) == (130, b"", b"interrupted\n"), (delay, error.decode()[-3000:])


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("JAX_ENABLE_COMPILATION_CACHE", "maybe", "true, yes, on or 1"),
        ("JAX_COMPILATION_CACHE_MAX_SIZE", "abc", "a whole number of bytes"),
        ("JAX_COMPILATION_CACHE_MAX_SIZE", "1e9", "a whole number of bytes"),
        ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "soon", "a number of seconds"),
    ],
)
def test_a_compilation_cache_variable_jax_would_refuse_is_one_line_before_jax_loads(variable, value, named):
    """jax reads these as it is imported: a bad value was a 38-line traceback from that import."""
    env = {**os.environ, variable: value}
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from jaxformer.commands.launch import train; sys.exit(train(['--help']))"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: environment variable {variable}={value!r}")
    assert named in result.stderr and result.stderr.count("\n") == 1


def test_the_values_jax_accepts_pass():
    from jaxformer.commands.launch import jax_variable_error

    accepted = {"JAX_ENABLE_COMPILATION_CACHE": "False", "JAX_COMPILATION_CACHE_MAX_SIZE": " 1_000 "}
    assert jax_variable_error({**accepted, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"}) is None


# A command whose imports reach sentencepiece's model proto under a protobuf that refuses it, as
# protobuf 6.33 refuses sentencepiece 0.2.3's (tests/data/test_sentencepiece_proto.py).
OLD_PROTOBUF_COMMAND = """
import google.protobuf
from google.protobuf import runtime_version

def refuse(domain, major, minor, patch, suffix, location):
    raise runtime_version.VersionError(f"gencode {major}.{minor}.{patch} runtime 6.33.6 ...")

runtime_version.ValidateProtobufRuntimeVersion = refuse
google.protobuf.__version__ = "6.33.6"
from jaxformer.data import sentencepiece_proto

def main(argv=None):
    return 0
"""


def test_a_command_whose_imports_find_too_old_a_protobuf_says_so_in_one_line(tmp_path):
    (tmp_path / "old_protobuf_command.py").write_text(OLD_PROTOBUF_COMMAND)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from jaxformer.commands.launch import launch; sys.exit(launch('old_protobuf_command'))",
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode == 0:  # imported: this sentencepiece's model proto checks no protobuf version
        pytest.skip("the installed sentencepiece's model proto checks no protobuf version")
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert re.fullmatch(
        r"error: sentencepiece \S+'s model proto needs protobuf >= [\d.]+, and protobuf 6\.33\.6 "
        r"is installed: pip install [^\n]+\n",
        result.stderr,
    ), result.stderr
