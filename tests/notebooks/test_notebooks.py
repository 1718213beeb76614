"""Every notebook in notebooks/ runs top to bottom headless (nbclient, the venv's python3 kernel), in the
notebooks folder as JupyterLab would, with its runs written under a temporary RLKIT_RUNS. The notebooks
assert what they demonstrate (strict agrees bit for bit, the native control does not, the toggle is
applied), so a notebook that runs is a notebook that still shows what it says.

The committed notebooks carry no outputs (checked here too): `make notebooks` opens them clean.
"""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.conftest import REPO

NOTEBOOKS = REPO / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def test_the_notebooks_are_there():
    assert [p.name for p in ALL] == ["01_quickstart.ipynb", "02_strict_vs_native.ipynb", "03_token_heatmaps.ipynb",
                                     "04_live_monitoring.ipynb", "06_import.ipynb"]


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_RUNS", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    assert list(tmp_path.iterdir()), f"{path.name} wrote nothing under RLKIT_RUNS"
