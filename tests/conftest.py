"""Test settings: 8 simulated CPU devices and strict numerics, set before jax is imported."""

import os
import pathlib

# LLVM optimisation level 0 compiles the tiny test models about 3x faster on CPU; it does not
# change float semantics (fast-math stays off).
_flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in flag]
_flags.append("--xla_force_host_platform_device_count=8")
if not any("xla_backend_optimization_level" in flag for flag in _flags):
    _flags.append("--xla_backend_optimization_level=0")
os.environ["XLA_FLAGS"] = " ".join(_flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole run: pytest workers and the train.py
# subprocesses the tests start compile the same tiny programs many times over.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).parents[1] / ".pytest_cache" / "jax_compilation_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402

# Silent rank promotion hides shape bugs; make it an error in tests.
jax.config.update("jax_numpy_rank_promotion", "raise")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Multi30k prepared once per test session (per worker) as array_record files."""
    from jaxformer.data.sources import get_builder

    directory = tmp_path_factory.mktemp("tfds")
    get_builder("multi30k", data_dir=str(directory)).download_and_prepare()
    return directory

