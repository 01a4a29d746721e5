"""The persistent compilation cache every command uses: XLA programs one process compiles are
written to disk and read back by the next, so a second `jaxformer-translate` (evaluate, train,
generate, export, ...) of the same model skips its compilations.

Where: $JAX_COMPILATION_CACHE_DIR (jax's own variable) when set, else
$XDG_CACHE_HOME/jaxformer/xla, else ~/.cache/jaxformer/xla. JAXFORMER_COMPILATION_CACHE=0 (or
false, no, off; 1, true, yes, on or unset keep it on; anything else is refused) turns the cache
off, as does jax's own JAX_ENABLE_COMPILATION_CACHE=false; a command line that compiles nothing
(train --list_configs, --print_config) reads none of this. A directory that cannot be created or
written (a read-only one included: jax would fail each write) warns in one line saying why (a
file or a link to nowhere on its path, a folder that takes no new entries) and the command runs
without the cache. Programs that compiled in less than 0.1 s are not kept (reading them back
would cost about what compiling them does); JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS overrides
that, and jax's other JAX_COMPILATION_CACHE_* / JAX_PERSISTENT_CACHE_* variables (such as
JAX_COMPILATION_CACHE_MAX_SIZE, a bound in bytes) apply as jax documents them.

An entry that cannot be read (an interrupted write: a full disk, a process killed while writing)
would be compiled again by every later run, as jax never replaces an entry: when jax reports one,
the program's entries that do not decompress are removed (`repair_unreadable_entry`) and the
fresh compilation takes their place. The cache is trusted code: keep it where only you can write.
"""

from __future__ import annotations

import glob
import logging
import os
import pathlib
import re
import sys
import tempfile
import time
from collections.abc import Mapping

from jaxformer.errors import UserError
from jaxformer.files import unwritable_folder_reason

logger = logging.getLogger(__name__)

SWITCH = "JAXFORMER_COMPILATION_CACHE"
OFF = ("0", "false", "no", "off")
ON = ("", "1", "true", "yes", "on")
JAX_SWITCH = "JAX_ENABLE_COMPILATION_CACHE"
DIRECTORY_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
MIN_COMPILE_SECONDS = 0.1


def cache_directory(environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The directory the cache lives in, or None when JAXFORMER_COMPILATION_CACHE turns it off."""
    environ = os.environ if environ is None else environ
    switch = environ.get(SWITCH, "").strip().lower()
    if switch not in OFF + ON:
        raise UserError(
            f"{SWITCH}={environ[SWITCH]!r}: set it to 0, false, no or off to turn the compilation cache off "
            "(1, true, yes, on or unset keep it on)"
        )
    if switch in OFF or environ.get(JAX_SWITCH, "").strip().lower() in OFF:
        return None
    if environ.get(DIRECTORY_VARIABLE):
        return pathlib.Path(environ[DIRECTORY_VARIABLE]).expanduser()
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is invalid and ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jaxformer" / "xla"


def enable_compilation_cache(environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """Points jax at the cache directory (or turns its cache off); call before anything compiles.
    Returns the directory in use, or None when the cache is off or unusable."""
    environ = os.environ if environ is None else environ
    directory = cache_directory(environ)
    if directory is None:
        _set_jax_option("jax_enable_compilation_cache", False)
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Permission bits do not tell about read-only mounts: only a real write does.
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as error:
        # mkdir's own error misleads: "File exists" for a link to nowhere, "No such file or
        # directory" for a folder in /proc.
        reason = unwritable_folder_reason(directory) or error.strerror or type(error).__name__
        logger.warning("compilation cache %s: %s; the cache is off for this run", directory, reason)
        _set_jax_option("jax_enable_compilation_cache", False)
        return None
    _set_jax_option("jax_enable_compilation_cache", True)
    _set_jax_option("jax_compilation_cache_dir", str(directory))
    if MIN_COMPILE_TIME_VARIABLE not in environ:
        _set_jax_option("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return directory


def _set_jax_option(name: str, value: bool | float | str) -> None:
    """jax reads its JAX_* variables once, when imported: before that, setting the variable spares
    a command that stops at its flags the second it takes to import jax; after, only the config
    counts."""
    if "jax" in sys.modules:
        import jax

        jax.config.update(name, value)
    else:
        os.environ[name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)


# jax's warning when an entry cannot be read (jax/_src/compiler.py): the program's name, or the key.
_READ_ERROR = re.compile(r"Error reading persistent compilation cache entry for '([^']+)': (.*)", re.DOTALL)


def repair_unreadable_entry(warning: str) -> str | None:
    """For jax's warning that a cache entry could not be read: removes the entries of that program
    that do not decompress (jax would leave them, and compile the program again in every later
    run) and returns the one line to log instead; None for any other warning. An entry that
    decompresses but does not load is left, and named."""
    match = _READ_ERROR.fullmatch(warning.strip())
    if match is None:
        return None
    name, reason = match.group(1), match.group(2).strip().splitlines()[0]
    import jax

    if not jax.config.jax_compilation_cache_dir:  # not a directory jaxformer set up: nothing to look at
        return f"compilation cache: an entry for {name} could not be read ({reason}); compiling again"
    directory = pathlib.Path(jax.config.jax_compilation_cache_dir)
    # Its entries only (<program>-<hex key>-cache, or <key>-cache when jax names the key), not
    # another program's whose name starts alike (jit_step_with_ema beside jit_step).
    entry = re.compile(rf"{re.escape(name)}(-[0-9a-f]+)?-cache")
    pattern = f"{glob.escape(name)}-*-cache"
    entries = [path for path in sorted(directory.glob(f"{glob.escape(name)}*-cache")) if entry.fullmatch(path.name)]
    removed = [path for path in entries if _remove_if_unreadable(path)]
    if removed:
        names = ", ".join(path.name for path in removed)
        return (
            f"compilation cache: an entry for {name} could not be read ({reason}); removed {names} from "
            f"{directory}: compiling again, cached in its place"
        )
    return (
        f"compilation cache: an entry for {name} could not be read ({reason}); compiling again; to replace "
        f"the entry, remove {directory / pattern}"
    )


WRITING_SECONDS = 10.0  # jax writes an entry in place: one younger than this may be another process's, unfinished


def _remove_if_unreadable(path: pathlib.Path) -> bool:
    """Removes the cache entry `path` when jax could not decompress it and it is WRITING_SECONDS
    old (a younger one may still be being written); whether it did."""
    try:
        from jax._src.compilation_cache import decompress_executable  # the format jax wrote it in
    except ImportError:  # another jax's layout: nothing is removed that might be sound
        return False
    try:
        if time.time() - path.stat().st_mtime < WRITING_SECONDS:
            return False
        decompress_executable(path.read_bytes())
    except OSError:  # gone already (another process repaired it), or unreadable to us
        return False
    except Exception:  # zlib's or zstandard's error: truncated, empty or not an entry
        try:
            path.unlink()
        except OSError:
            return False
        return True
    return False
