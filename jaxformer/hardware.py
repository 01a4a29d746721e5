"""What the machine's accelerator does natively that the configs may ask about.

`model.matmul_dtype="auto"` (multi30k's setting) means bfloat16 weight products where they run
on bf16 hardware and float32 ones elsewhere: on a CPU without bf16 dot instructions XLA would
convert the operands back for every product (slower than float32, and some shapes have no
kernel there at all), and a GPU before Ampere emulates bf16 as well.
"""

from __future__ import annotations

import functools
import pathlib

import jax

# /proc/cpuinfo flags of bf16 dot-product instructions: x86 AVX512-BF16 and AMX-BF16; Arm's
# "bf16" feature (BFDOT, BFMMLA).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo's text (x86 "flags", Arm "Features"), of every core."""
    flags = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags)


@functools.cache
def _this_cpu_flags() -> frozenset[str]:
    try:
        return cpu_flags(pathlib.Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: no way to tell here
        return frozenset()


def native_bf16_matmuls(platform: str | None = None, flags: frozenset[str] | None = None) -> bool:
    """Whether bf16 x bf16 -> float32 products are native on `platform` (default: jax's default
    backend): on TPUs; on NVIDIA GPUs of compute capability 8.0 (Ampere) and later, and GPUs that
    report none; on a CPU, when its flags (default: this machine's) name bf16 dot instructions."""
    platform = jax.default_backend() if platform is None else platform
    if platform == "gpu":
        capability = getattr(jax.devices()[0], "compute_capability", None)
        return capability is None or float(capability) >= 8.0
    if platform != "cpu":
        return True
    return bool(BF16_CPU_FLAGS & (_this_cpu_flags() if flags is None else flags))


def resolve_matmul_dtype(value):
    """A model section's matmul_dtype with "auto" made concrete: "bfloat16" where bf16 products
    are native (`native_bf16_matmuls`), None (the compute dtype) elsewhere; other values as they are."""
    if value != "auto":
        return value
    return "bfloat16" if native_bf16_matmuls() else None
