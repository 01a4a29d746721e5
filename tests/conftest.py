"""Test settings: 8 simulated CPU devices and strict numerics, set before jax is imported."""

import os

# LLVM optimisation level 0 compiles the tiny test models about 3x faster on CPU; it does not
# change float semantics (fast-math stays off).
_flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in flag]
_flags.append("--xla_force_host_platform_device_count=8")
if not any("xla_backend_optimization_level" in flag for flag in _flags):
    _flags.append("--xla_backend_optimization_level=0")
os.environ["XLA_FLAGS"] = " ".join(_flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

# Silent rank promotion hides shape bugs; make it an error in tests.
jax.config.update("jax_numpy_rank_promotion", "raise")
