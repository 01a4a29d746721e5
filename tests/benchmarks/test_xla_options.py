"""benchmarks.xla_options: its rows, its options' parsing, and its data-parallel row's step."""

import argparse

import jax
import numpy as np
import pytest

from benchmarks import xla_options
from jaxformer.training.config_file import load_config
from tests.benchmarks.test_smoke import run_smoke


@pytest.mark.slow  # five compilations of the step; the option and data-parallel paths are tested below
def test_smoke_times_the_options_and_the_data_parallel_row_against_the_default(tmp_path, capsys):
    rows = run_smoke("xla_options", tmp_path, capsys)
    assert [(row["variant"], row["devices"]) for row in rows] == [
        ("default", 1),
        ("concurrency_scheduler", 1),
        ("data_parallel_2", 2),
    ]
    assert rows[1]["options"] == "xla_cpu_enable_concurrency_optimized_scheduler=True"
    assert rows[0]["speedup"] == 1.0


def test_options_parse_to_typed_compiler_options():
    assert xla_options.parse_option("wide=xla_cpu_prefer_vector_width:512,xla_cpu_enable_fast_math:TRUE") == (
        "wide",
        {"xla_cpu_prefer_vector_width": 512, "xla_cpu_enable_fast_math": True},
    )
    assert xla_options.parse_option("f=a:1.5,b:false,c:x")[1] == {"a": 1.5, "b": False, "c": "x"}
    for bad in ("nokey", "name=key", "=key:1", "name=key:"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=KEY:VALUE"):
            xla_options.parse_option(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="a is given twice"):
        xla_options.parse_option("f=a:1,a:2")


def test_an_option_reaches_the_compiler(capsys):
    """XLA itself names an option it does not know (checked on a scalar function, before the steps)."""
    with pytest.raises(SystemExit) as exit_info:
        xla_options.main(["--smoke", "--devices", "1", "--option", "bad=xla_cpu_no_such_option:true"])
    assert exit_info.value.code == 2
    assert "No such compile option: 'xla_cpu_no_such_option'" in capsys.readouterr().err
    xla_options.check_options({"fast": {"xla_cpu_enable_fast_math": True}})  # one it knows: compiled


@pytest.mark.slow  # the step compiled for 1 and 2 devices; steps across meshes are compared in test_sharding.py
def test_the_data_parallel_step_splits_the_rows_and_computes_the_same_step():
    config = load_config("tiny")
    steps = xla_options.experiment_steps(config, {"one": (1, {}), "two": (2, {})}, jax.devices()[:2])
    assert len(steps["one"].batch["targets"].sharding.device_set) == 1
    assert len(steps["two"].batch["targets"].sharding.device_set) == 2
    one, two = steps["one"](), steps["two"]()  # one step each from the same initial state
    # The same rows under the same dropout masks: the same loss and gradient (not compared
    # through the parameters: Adam's first update, g / |g|, blows rounding up in tiny gradients).
    for key in ("loss_sum", "weight", "grad_norm"):
        np.testing.assert_allclose(float(one[key]), float(two[key]), rtol=1e-5, err_msg=key)
