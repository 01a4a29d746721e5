"""Processes of one run holding different numbers of devices: one line in each, before the first
gather across them (which needs equal parts and failed with a reshape traceback)."""

import types

import pytest

from jaxformer.model.config import ConfigError
from jaxformer.training import processes


def devices(*counts):
    return [types.SimpleNamespace(process_index=index) for index, count in enumerate(counts) for _ in range(count)]


def test_equal_device_counts_pass():
    processes.check_same_device_counts(devices(2, 2))
    processes.check_same_device_counts(devices(8))


def test_different_device_counts_are_one_line_naming_each_process():
    with pytest.raises(ConfigError) as error:
        processes.check_same_device_counts(devices(2, 4, 2))
    assert str(error.value) == (
        "the processes hold different numbers of devices (process 0 has 2, process 1 has 4, process 2 has 2); give "
        "every host the same number (CUDA_VISIBLE_DEVICES, or --xla_force_host_platform_device_count on CPU)"
    )
