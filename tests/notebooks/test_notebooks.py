"""Every notebook in notebooks/ runs top to bottom headless (nbclient, the venv's python3 kernel), in the
notebooks folder as JupyterLab would, with its runs written under a temporary RLKIT_RUNS. The notebooks
assert what they demonstrate (strict agrees bit for bit, the native control does not, the toggle is
applied), so a notebook that runs is a notebook that still shows what it says.

The committed notebooks carry no outputs (checked here too): `make notebooks` opens them clean.

The notebooks run two at a time, each in its own kernel (one torch thread each: the notebooks set it), so
both of the 2 cores work; each notebook's test then reads its own notebook's outcome.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.conftest import REPO

NOTEBOOKS = REPO / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT_S = 600
AT_ONCE = 2
"""Notebooks executing at the same time (one kernel process each)."""


def test_the_notebooks_are_there():
    assert [p.name for p in ALL] == ["01_quickstart.ipynb", "02_strict_vs_native.ipynb", "03_token_heatmaps.ipynb",
                                     "04_live_monitoring.ipynb", "05_learning.ipynb", "06_import.ipynb"]


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


async def _execute(path, runs, slots: asyncio.Semaphore) -> tuple:
    """(the executed notebook, the error it raised or None); its runs go under `runs`."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    async with slots:
        try:
            await client.async_execute(env={**os.environ, "RLKIT_RUNS": str(runs)})
        except Exception as e:  # noqa: BLE001 - reported by this notebook's own test
            return nb, e
    return nb, None


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> dict:
    """{notebook path: (executed notebook, the error it raised or None, its RLKIT_RUNS folder)}."""
    runs = {path: tmp_path_factory.mktemp(path.stem) for path in ALL}

    async def all_of_them():
        slots = asyncio.Semaphore(AT_ONCE)
        return await asyncio.gather(*(_execute(path, runs[path], slots) for path in ALL))

    # a thread of its own: asyncio.run refuses a thread where an event loop is marked running, and a
    # library loaded by an earlier test may have left one so on the main thread
    with ThreadPoolExecutor(1) as own_thread:
        outcomes = own_thread.submit(asyncio.run, all_of_them()).result()
    yield {path: (*got, runs[path]) for path, got in zip(ALL, outcomes)}
    for folder in runs.values():
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_top_to_bottom(path, executed):
    nb, failure, runs = executed[path]
    if isinstance(failure, CellExecutionError):
        pytest.fail(f"{path.name} failed:\n{failure}")
    if failure is not None:
        raise failure
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    assert list(runs.iterdir()), f"{path.name} wrote nothing under RLKIT_RUNS"
