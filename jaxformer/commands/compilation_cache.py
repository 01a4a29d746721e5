"""The persistent compilation cache every command uses: XLA programs one process compiles are
written to disk and read back by the next, so a second `jaxformer-translate` (evaluate, train,
generate, export, ...) of the same model skips its compilations.

Where: $JAX_COMPILATION_CACHE_DIR (jax's own variable) when set, else
$XDG_CACHE_HOME/jaxformer/xla, else ~/.cache/jaxformer/xla. JAXFORMER_COMPILATION_CACHE=0
turns the cache off. A directory that cannot be created or written warns in one line and the
command runs without the cache. Programs that compiled in less than 0.1 s are not kept (reading
them back would cost about what compiling them does); JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
overrides that, and jax's other JAX_COMPILATION_CACHE_* / JAX_PERSISTENT_CACHE_* variables apply
as jax documents them. The cache is trusted code: keep it where only you can write.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
import tempfile
from collections.abc import Mapping

SWITCH = "JAXFORMER_COMPILATION_CACHE"
OFF = ("0", "false", "no", "off")
DIRECTORY_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
MIN_COMPILE_SECONDS = 0.1


def cache_directory(environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The directory the cache lives in, or None when JAXFORMER_COMPILATION_CACHE turns it off."""
    environ = os.environ if environ is None else environ
    if environ.get(SWITCH, "").strip().lower() in OFF:
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
        reason = error.strerror or type(error).__name__
        logging.warning("compilation cache %s is unusable (%s): running without it", directory, reason)
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
