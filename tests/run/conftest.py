"""A fresh copy, per test, of the run its module builds once as `run_template` (workdir, params)."""

import shutil

import pytest


@pytest.fixture
def run(run_template, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(run_template[0], workdir)
    return workdir, run_template[1]
