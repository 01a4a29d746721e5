"""notebooks/quickstart.ipynb runs top to bottom (QUICK mode) and its plots are real images."""

import copy
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
pytestmark = pytest.mark.xdist_group("notebook")


def test_committed_notebook_is_the_generated_one_without_outputs():
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import make_quickstart
    finally:
        sys.path.pop(0)
    committed = nbformat.read(NOTEBOOK, as_version=4)
    for cell in committed.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "commit the notebook without outputs"
    generated = make_quickstart.build()
    assert [c.source for c in committed.cells] == [c.source for c in generated.cells], (
        "notebooks/quickstart.ipynb is stale: run python notebooks/make_quickstart.py"
    )


def test_notebook_executes_in_quick_mode(tmp_path, monkeypatch):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("JAXFORMER_QUICK", "1")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")  # one CPU device, as on Colab
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    executed = copy.deepcopy(notebook)
    client = nbclient.NotebookClient(
        executed, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error

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
