"""notebooks/quickstart.ipynb runs top to bottom (QUICK mode) and its plots are real images; its
own install cell installs jaxformer from the wheel (tests/install_env.py) into a fresh venv,
whose Python runs the notebook's kernel."""

import copy
import json
import pathlib
import re
import sys
import tomllib

import pytest

from tests.xla_flags import xla_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
pytestmark = pytest.mark.xdist_group("notebook")


def generator():
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import make_quickstart
    finally:
        sys.path.pop(0)
    return make_quickstart


def test_committed_notebook_is_the_generated_one_without_outputs():
    make_quickstart = generator()
    committed = nbformat.read(NOTEBOOK, as_version=4)
    for cell in committed.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "commit the notebook without outputs"
    generated = make_quickstart.build()
    assert [c.source for c in committed.cells] == [c.source for c in generated.cells], (
        "notebooks/quickstart.ipynb is stale: run python notebooks/make_quickstart.py"
    )


def test_repository_url_is_written_once():
    """pyproject.toml holds the address; the notebook is built from it, and README.md uses it twice, in
    the Colab badge and in the git install line: every copy README.md holds is one of those two, equal
    to pyproject's, so that a third one, or one left behind when the address changes, is caught."""
    make_quickstart = generator()
    url = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert make_quickstart.REPOSITORY == url
    install_cell = next(cell.source for cell in make_quickstart.build().cells if "%pip install" in cell.source)
    assert f'REPOSITORY_URL = "{url}"' in install_cell
    readme = (ROOT / "README.md").read_text()
    owner_and_name = url.removeprefix("https://github.com/")
    copies = re.findall(r"[\w.:/@+-]*github(?:\.com)?[/:]" + re.escape(owner_and_name) + r"[^\s)\"'`]*", readme)
    assert copies == [make_quickstart.COLAB_URL, f"git+{url}"]


def kernel_in(venv, jupyter_path):
    """A kernelspec, in `jupyter_path`, that starts the kernel with the venv's Python."""
    folder = jupyter_path / "kernels" / "jaxformer-venv"
    folder.mkdir(parents=True)
    spec = {
        "argv": [str(venv.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "jaxformer (fresh venv)",
        "language": "python",
    }
    (folder / "kernel.json").write_text(json.dumps(spec))
    return "jaxformer-venv"


@pytest.mark.slow  # about a minute: a fresh venv from the wheel, then every cell (python -m pytest -m slow)
def test_notebook_executes_in_quick_mode(tmp_path, monkeypatch, install_build):
    from tests.install_env import make_venv

    venv = make_venv(tmp_path / "venv", install_build)  # jaxformer not installed: the install cell installs it
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for key, value in venv.environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("JAXFORMER_PACKAGE", str(install_build.wheel))
    # The cell's `pip install` as it is, told through pip's environment: no index (never the network),
    # no dependencies (they are there already; resolving them costs seconds).
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_NO_DEPS", "1")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JAXFORMER_QUICK", "1")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setenv("XLA_FLAGS", xla_flags())  # one CPU device, as on Colab
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    executed = copy.deepcopy(notebook)
    client = nbclient.NotebookClient(
        executed,
        timeout=600,
        kernel_name=kernel_in(venv, tmp_path / "jupyter"),
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error

    (install_cell,) = [cell for cell in executed.cells if "%pip install" in cell.source]
    printed = "".join(output.get("text", "") for output in install_cell.outputs)
    location = re.search(r"^jaxformer \S+ from (\S+) ", printed, flags=re.MULTILINE)
    assert location, printed
    assert pathlib.Path(location.group(1)).is_relative_to(venv.path), printed  # the wheel, not the checkout
    assert list(venv.path.glob("lib/python*/site-packages/jaxformer-*.dist-info")), "the install cell installed nothing"

    plots = [cell for cell in executed.cells if "plot" in cell.metadata.get("tags", [])]
    assert len(plots) >= 5
    for cell in plots:
        images = [output for output in cell.outputs if "image/png" in output.get("data", {})]
        assert images, f"plot cell produced no image:\n{cell.source[:200]}"
    text = "\n".join(
        output.get("text", "")
        for cell in executed.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
    assert "sacreBLEU on 40 sentences" in text and "beam output: (3, 4, 74)" in text
    # The training cell shows the run's log as jaxformer-train does (the root logger alone shows nothing).
    assert re.search(r"^\d\d:\d\d:\d\d I step 30: validation loss ", text, flags=re.MULTILINE), text[:3000]
    assert "the same as beam.translate: True" in text  # the jitted search's ids, read with the target's tokenizer
