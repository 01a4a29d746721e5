"""The persistent compilation cache every command sets up: its directory, the switch that turns it
off, a directory it cannot use, and a second process reading what the first wrote."""

import os
import pathlib
import subprocess
import sys
import time
import tomllib

import pytest

from jaxformer.commands import common
from jaxformer.commands.compilation_cache import cache_directory
from jaxformer.errors import EXIT_USER_ERROR, UserError

ROOT = pathlib.Path(__file__).parents[2]

# A command in miniature: run_command's set-up, then one compilation, and the persistent cache
# hits jax counted (jax.monitoring's public event), printed. `import jax` first, or not: the
# set-up goes through jax's config or its environment variables.
PROCESS = """
import sys
if sys.argv[1] == "jax-first":
    import jax
from jaxformer.commands import common

assert ("jax" in sys.modules) == (sys.argv[1] == "jax-first")  # which way the set-up goes
hits = []

def body(args):
    import jax
    import jax.numpy as jnp

    def count(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(count)
    print("result", float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).sum()))
    print("hits", len(hits))
    return 0

sys.exit(common.run_command(common.make_parser(None), body, []))
"""


def run_process(tmp_path, jax_first=False, **variables):
    """A PROCESS with XDG_CACHE_HOME in `tmp_path`, none of the test session's cache settings, and
    every program cached however fast it compiles; `variables` add to its environment."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JAX_COMPILATION", "JAXFORMER_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argument = "jax-first" if jax_first else "plain"
    result = subprocess.run(
        [sys.executable, "-c", PROCESS, argument], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result 430.83" in result.stdout  # the body ran (64 x 8 sin(1)), whatever the cache did
    return int(result.stdout.split("hits ")[1].split()[0]), result.stderr


def entries(directory):
    return sorted(path.name for path in directory.rglob("*") if path.is_file() and not path.name.startswith("."))


def test_the_directory_is_jaxs_variable_else_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_directory({}) == tmp_path / "home" / ".cache" / "jaxformer" / "xla"
    assert cache_directory({"XDG_CACHE_HOME": "/xdg"}) == pathlib.Path("/xdg/jaxformer/xla")
    # A relative XDG_CACHE_HOME is invalid (the XDG spec): ignored.
    assert cache_directory({"XDG_CACHE_HOME": "relative"}) == tmp_path / "home" / ".cache" / "jaxformer" / "xla"
    both = {"XDG_CACHE_HOME": "/xdg", "JAX_COMPILATION_CACHE_DIR": "/jax"}
    assert cache_directory(both) == pathlib.Path("/jax")
    for off in ("0", "false", "OFF", "no"):
        assert cache_directory({**both, "JAXFORMER_COMPILATION_CACHE": off}) is None
    assert cache_directory({**both, "JAXFORMER_COMPILATION_CACHE": "1"}) == pathlib.Path("/jax")
    assert cache_directory({**both, "JAX_ENABLE_COMPILATION_CACHE": "false"}) is None  # jax's own switch
    with pytest.raises(UserError, match=r"^JAXFORMER_COMPILATION_CACHE='disabled': set it to 0, false, no or off"):
        cache_directory({**both, "JAXFORMER_COMPILATION_CACHE": "disabled"})  # not taken for "on"


def test_a_switch_value_it_does_not_know_is_one_line_before_the_command_runs(monkeypatch, capsys):
    monkeypatch.setenv("JAXFORMER_COMPILATION_CACHE", "none")
    ran = []
    assert common.run_command(common.make_parser(None), ran.append, []) == EXIT_USER_ERROR and not ran
    assert capsys.readouterr().err.startswith("error: JAXFORMER_COMPILATION_CACHE='none': set it to 0")


def test_flags_that_only_inform_do_not_depend_on_the_cache_settings(monkeypatch, capsys, tmp_path):
    """train --list_configs and --print_config compile nothing: a switch value the cache refuses
    does not stop them (it did, in one line); a run that trains still refuses it so."""
    from jaxformer.commands import train

    monkeypatch.setenv("JAXFORMER_COMPILATION_CACHE", "maybe")
    assert train.main(["--list_configs"]) == 0
    assert "multi30k" in capsys.readouterr().out
    assert train.main(["--config", "tiny", "--print_config"]) == 0
    assert "num_train_steps" in capsys.readouterr().out
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path / "run")]) == EXIT_USER_ERROR
    assert capsys.readouterr().err.startswith("error: JAXFORMER_COMPILATION_CACHE='maybe': set it to 0")
    assert not (tmp_path / "run").exists()


def test_an_entry_left_unreadable_is_replaced_by_the_next_compilation(tmp_path):
    """jax never overwrites an entry: one cut short (a full disk, a process killed while writing)
    cost every later run the compilation and a raw two-line warning. It is removed, in one line,
    and the program compiled again takes its place."""
    from jax._src.compilation_cache import decompress_executable

    directory = tmp_path / "cache"
    run_process(tmp_path, JAX_COMPILATION_CACHE_DIR=str(directory))
    written = [path for path in directory.iterdir() if path.name.endswith("-cache")]
    [entry] = [path for path in written if path.name.startswith("jit__lambda")]
    entry.write_bytes(entry.read_bytes()[:100])  # cut short
    os.utime(entry, (time.time() - 60, time.time() - 60))  # by an earlier run (a younger one may be in writing)
    hits, stderr = run_process(tmp_path, JAX_COMPILATION_CACHE_DIR=str(directory))
    assert hits == len(written) - 1  # the others read back; this one compiled
    lines = [line for line in stderr.splitlines() if "cache" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert "W compilation cache: an entry for jit__lambda" in lines[0] and " could not be read (" in lines[0]
    assert lines[0].endswith(f"removed {entry.name} from {directory}: compiling again, cached in its place")
    decompress_executable(entry.read_bytes())  # written anew, whole


@pytest.mark.parametrize("jax_first", [False, True], ids=["before-jax", "after-jax"])
def test_a_second_process_reads_what_the_first_compiled(tmp_path, jax_first):
    default = tmp_path / "xdg" / "jaxformer" / "xla"
    hits, _ = run_process(tmp_path, jax_first)
    written = entries(default)
    assert hits == 0 and written  # compiled, and kept in the default directory
    if jax_first:
        return  # where the set-up differs: writing; reading back is jax's own
    hits, _ = run_process(tmp_path)
    assert hits >= 1 and entries(default) == written  # read back, nothing compiled anew


def test_the_switch_turns_the_cache_off_even_with_jaxs_directory_set(tmp_path):
    directory = tmp_path / "jax-cache"
    hits, _ = run_process(tmp_path, JAX_COMPILATION_CACHE_DIR=str(directory), JAXFORMER_COMPILATION_CACHE="0")
    assert hits == 0
    assert not directory.exists() and not (tmp_path / "xdg").exists()


def test_an_unusable_directory_warns_once_and_the_command_runs(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    hits, stderr = run_process(tmp_path, JAX_COMPILATION_CACHE_DIR=str(blocker / "cache"))
    assert hits == 0
    warnings = [line for line in stderr.splitlines() if "compilation cache" in line]
    assert len(warnings) == 1, stderr[-3000:]  # not jax's warning at every compilation
    expected = f"{blocker / 'cache'}: {blocker} is a file, not a folder; the cache is off for this run"
    assert warnings[0].endswith(f"compilation cache {expected}")
    assert "Traceback" not in stderr


def unusable_warning(monkeypatch, caplog, directory):
    """The one warning enable_compilation_cache logs for `directory`, checking that it turned the
    cache off (the jax options it set are recorded, not applied to this test session)."""
    from jaxformer.commands import compilation_cache

    options = {}
    monkeypatch.setattr(compilation_cache, "_set_jax_option", options.__setitem__)
    with caplog.at_level("WARNING", logger=compilation_cache.__name__):
        assert compilation_cache.enable_compilation_cache({"JAX_COMPILATION_CACHE_DIR": str(directory)}) is None
    assert options == {"jax_enable_compilation_cache": False}
    [record] = caplog.records
    return record.getMessage()


def test_a_link_to_nowhere_is_named_with_its_target(monkeypatch, caplog, tmp_path):
    """mkdir's error for a dangling link is "File exists", which the warning passed on as the reason."""
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "moved-disk" / "xla")
    assert unusable_warning(monkeypatch, caplog, link) == (
        f"compilation cache {link}: is a link to {tmp_path / 'moved-disk' / 'xla'}, which does not exist; "
        "the cache is off for this run"
    )
    caplog.clear()
    below = link / "jaxformer"
    assert unusable_warning(monkeypatch, caplog, below) == (
        f"compilation cache {below}: {link} is a link to {tmp_path / 'moved-disk' / 'xla'}, which does not exist; "
        "the cache is off for this run"
    )
    assert not (tmp_path / "moved-disk").exists()  # nothing created on the link's behalf


def test_a_file_or_a_link_to_one_is_named_as_a_file(monkeypatch, caplog, tmp_path):
    a_file = tmp_path / "xla"
    a_file.write_text("kept\n")
    link = tmp_path / "link"
    link.symlink_to(a_file)
    expected = {
        a_file: f"compilation cache {a_file}: is a file, not a folder",
        link: f"compilation cache {link}: is a link to {a_file}, a file, not a folder",
    }
    for directory, start in expected.items():
        caplog.clear()
        assert unusable_warning(monkeypatch, caplog, directory) == f"{start}; the cache is off for this run"
    assert a_file.read_text() == "kept\n"


def test_a_folder_on_a_read_only_file_system_says_so(monkeypatch, caplog, tmp_path):
    """Where the kernel refuses the write (a read-only mount; mocked here, as tests cannot mount),
    its reason is passed on, naming the folder."""
    import errno
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    assert unusable_warning(monkeypatch, caplog, tmp_path) == (
        f"compilation cache {tmp_path}: {tmp_path} takes no new entries (Read-only file system); "
        "the cache is off for this run"
    )


class CacheSetUp(Exception):
    """Raised by the stand-in set-up: the command got that far, and runs nothing more."""


# Arguments each command parses; the set-up comes next, before its body.
ARGUMENTS = {
    "jaxformer-train": ["--config", "tiny", "--workdir", "w"],
    "jaxformer-translate": ["--workdir", "w"],
    "jaxformer-evaluate": ["--workdir", "w"],
    "jaxformer-average-checkpoints": ["--workdir", "w"],
    "jaxformer-export": ["--workdir", "w", "--output", "o"],
    "jaxformer-generate": ["--workdir", "w"],
    "jaxformer-convert": ["--to_hf", "w", "--output", "o"],
    "jaxformer-sweep": ["--config", "tiny", "--sweep", "s.py", "--workdir", "w"],
}


def test_every_command_sets_the_cache_up(monkeypatch):
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(ARGUMENTS)  # a new command: add its arguments here

    def stand_in():
        raise CacheSetUp

    monkeypatch.setattr(common, "enable_compilation_cache", stand_in)
    for script, target in scripts.items():
        module, function = target.split(":")
        with pytest.raises(CacheSetUp):
            getattr(importlib.import_module(module), function)(ARGUMENTS[script])


def test_the_repair_leaves_entries_in_writing_and_other_programs_alone(tmp_path):
    import jax

    from jaxformer.commands.compilation_cache import repair_unreadable_entry

    old = time.time() - 60
    damaged, other, writing = (
        tmp_path / name for name in ("jit_step-0a1b-cache", "jit_step_with_ema-2c3d-cache", "jit_step-4e5f-cache")
    )
    for path in (damaged, other, writing):
        path.write_bytes(b"cut")
    for path in (damaged, other):
        os.utime(path, (old, old))
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        line = repair_unreadable_entry("Error reading persistent compilation cache entry for 'jit_step': error: bad")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert line.endswith(f"removed jit_step-0a1b-cache from {tmp_path}: compiling again, cached in its place")
    assert not damaged.exists() and other.exists() and writing.exists()
