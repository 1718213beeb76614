"""Shared test set-up: deterministic seeds, the repository's data folder, and device markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RLKIT_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config):
    # The strict CPU references run many small ops; on these 2-core machines one thread is several
    # times faster than two (OpenMP hand-offs dominate). Both sides of every comparison use the same.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (run on the H200)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def data_dir() -> Path:
    assert DATA.is_dir(), f"the shared data folder is missing: {DATA}"
    return DATA
