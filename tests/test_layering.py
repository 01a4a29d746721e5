"""Subpackages import downward only: model and data <- run <- decoding <- training, export <- interop <- commands.

Each subpackage's modules are all imported in a fresh interpreter; none of the subpackages
above it (or beside it: model and data are independent) may then be loaded.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
MAY_IMPORT = {
    "model": set(),
    "data": set(),
    "run": {"model", "data"},
    "decoding": {"model", "data", "run"},
    "training": {"model", "data", "run", "decoding"},
    "export": {"model", "data", "run", "decoding"},
    "interop": {"model", "data", "run", "decoding", "training", "export"},
    "commands": {"model", "data", "run", "decoding", "training", "export", "interop"},
}

PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module("jaxformer." + sys.argv[1])
modules = [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in modules:
    importlib.import_module(name)
loaded = sorted({name.split(".")[1] for name in sys.modules if name.startswith("jaxformer.") and name.count(".") >= 1})
print(json.dumps({"modules": modules, "loaded": loaded}))
"""


@pytest.mark.parametrize("subpackage", list(MAY_IMPORT))
def test_subpackage_imports_only_lower_layers(subpackage):
    result = subprocess.run(
        [sys.executable, "-c", PROBE, subpackage], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["modules"], f"jaxformer.{subpackage} has no modules"
    forbidden = (set(MAY_IMPORT) - MAY_IMPORT[subpackage] - {subpackage}) & set(report["loaded"])
    assert not forbidden, f"importing jaxformer.{subpackage} loads jaxformer.{', jaxformer.'.join(sorted(forbidden))}"
