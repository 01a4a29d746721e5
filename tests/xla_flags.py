"""XLA:CPU options for the test processes and every process they start (train.py runs, two-process
runs, installed wheels, the notebook): the suite is mostly compilation (docs/test_suite.md).

LLVM optimisation level 0 compiles the tiny test models about 3x faster; XLA:CPU's older elemental
emitters for fused loops compile them in about half the time of its MLIR fusion emitters
(benchmarks/compile_time.py). Neither uses fast math, but their loops may order float operations
otherwise: a model trained under these options can differ in its last bits from one trained under
XLA's defaults (a 40-step language model did; docs/test_suite.md), so no test may count on a
particular trained model's outputs. The product's own programs keep XLA's defaults.
Stdlib only: tests/conftest.py reads it before jax is imported.
"""

FAST_COMPILES = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a test's process: the fast compiles, on `devices` simulated CPU devices (one if None)."""
    flags = list(FAST_COMPILES)
    if devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)
