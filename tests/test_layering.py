"""Subpackages import downward only: model and data <- run <- decoding <- training, export <- interop <- commands.

Each subpackage's modules are all imported in a process with no jaxformer module loaded; none
of the subpackages above it (or beside it: model and data are independent) may then be loaded.
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

# One interpreter imports the third-party libraries, then forks a child per subpackage: each
# child starts with no jaxformer module loaded, as a fresh interpreter would, without paying for
# jax, flax, orbax and tfds eight times.
PROBE = """
import importlib, json, os, pkgutil, sys
for library in ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "orbax.checkpoint", "tensorflow_datasets",
                "grain", "sentencepiece", "sacrebleu", "ml_collections"):
    importlib.import_module(library)
assert not [name for name in sys.modules if name.startswith("jaxformer")]
reports = {}
for subpackage in sys.argv[1:]:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            package = importlib.import_module("jaxformer." + subpackage)
            modules = [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
            for name in modules:
                importlib.import_module(name)
            loaded = sorted({n.split(".")[1] for n in sys.modules if n.startswith("jaxformer.") and n.count(".") >= 1})
            report = {"modules": modules, "loaded": loaded}
        except BaseException as error:
            report = {"error": repr(error)}
        with os.fdopen(write, "w") as out:
            json.dump(report, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        reports[subpackage] = json.loads(answer.read())
    os.wait()
print(json.dumps(reports))
"""


# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("layering")


@pytest.fixture(scope="module")
def reports():
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *MAY_IMPORT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("subpackage", list(MAY_IMPORT))
def test_subpackage_imports_only_lower_layers(reports, subpackage):
    report = reports[subpackage]
    assert "error" not in report, f"importing jaxformer.{subpackage}: {report.get('error')}"
    assert report["modules"], f"jaxformer.{subpackage} has no modules"
    forbidden = (set(MAY_IMPORT) - MAY_IMPORT[subpackage] - {subpackage}) & set(report["loaded"])
    assert not forbidden, f"importing jaxformer.{subpackage} loads jaxformer.{', jaxformer.'.join(sorted(forbidden))}"
