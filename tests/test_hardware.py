"""model.matmul_dtype="auto": bf16 weight products only where the hardware has bf16 dots."""

import jax
import pytest

from jaxformer import hardware
from jaxformer.configs import multi30k
from jaxformer.training.config_file import apply_overrides
from jaxformer.training.experiment import model_config
from jaxformer.training.resume_rules import resume_differences

X86 = """processor\t: 0
flags\t\t: fpu vme sse2 avx2 avx512f avx512_vnni avx512_bf16
processor\t: 1
flags\t\t: fpu vme sse2 avx2 avx512f avx512_vnni avx512_bf16
"""
ICE_LAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
GRAVITON3 = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_flags_are_read_from_x86_and_arm_cpuinfo():
    assert {"avx512_bf16", "avx2"} <= hardware.cpu_flags(X86)
    assert "bf16" in hardware.cpu_flags(GRAVITON3) and "2100.00" not in hardware.cpu_flags(GRAVITON3)
    assert hardware.cpu_flags("") == frozenset()


@pytest.mark.parametrize("cpuinfo, native", [(X86, True), (ICE_LAKE, False), (GRAVITON3, True), ("", False)])
def test_bf16_products_are_native_on_cpus_with_bf16_dots_and_on_accelerators(cpuinfo, native):
    flags = hardware.cpu_flags(cpuinfo)
    assert hardware.native_bf16_matmuls("cpu", flags) is native
    assert hardware.native_bf16_matmuls("gpu", flags) and hardware.native_bf16_matmuls("tpu", flags)


def test_auto_resolves_by_this_machine_and_other_values_pass_through(monkeypatch):
    assert hardware.resolve_matmul_dtype(None) is None
    assert hardware.resolve_matmul_dtype("bfloat16") == "bfloat16"
    monkeypatch.setattr(hardware, "_this_cpu_flags", lambda: hardware.cpu_flags(ICE_LAKE))
    assert hardware.resolve_matmul_dtype("auto") == (None if jax.default_backend() == "cpu" else "bfloat16")
    monkeypatch.setattr(hardware, "_this_cpu_flags", lambda: hardware.cpu_flags(X86))
    assert hardware.resolve_matmul_dtype("auto") == "bfloat16"


def test_multi30k_asks_for_auto_and_its_model_gets_a_concrete_dtype(monkeypatch):
    config = multi30k.get_config()
    assert config.model.matmul_dtype == "auto"
    for cpuinfo, expected in ((ICE_LAKE, None), (X86, "bfloat16")):
        monkeypatch.setattr(hardware, "_this_cpu_flags", lambda cpuinfo=cpuinfo: hardware.cpu_flags(cpuinfo))
        monkeypatch.setattr(hardware.jax, "default_backend", lambda: "cpu")
        model = model_config(config, 8000)
        assert model.to_dict()["matmul_dtype"] == expected
        assert model.dtype.name == "float32"


def test_none_on_the_command_line_turns_auto_off_and_matches_a_run_from_before_the_key():
    """A multi30k workdir trained before matmul_dtype existed saved no such key (float32
    products): `--config.model.matmul_dtype=None` resumes it, "auto" is a difference."""
    config = multi30k.get_config()
    saved = config.to_dict()
    del saved["model"]["matmul_dtype"]
    assert resume_differences(saved, config) == ["model.matmul_dtype: None -> 'auto'"]
    apply_overrides(config, [("model.matmul_dtype", "None")])
    assert config.model.matmul_dtype is None
    assert resume_differences(saved, config) == []
    assert model_config(config, 8000).matmul_operand_dtype.name == "float32"


@pytest.mark.parametrize("capability, native", [("7.5", False), ("8.0", True), ("9.0", True), (None, True)])
def test_gpus_from_ampere_on_have_bf16_products(monkeypatch, capability, native):
    class Device:
        pass

    device = Device()
    if capability is not None:
        device.compute_capability = capability
    monkeypatch.setattr(hardware.jax, "devices", lambda: [device])
    assert hardware.native_bf16_matmuls("gpu", frozenset()) is native
