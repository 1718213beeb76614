"""Make `rlkit.kernels` importable for tests/gpu where rlkit is not installed (a bare copy of the checkout
run with PYTHONPATH=.: `kernels/` becomes `rlkit.kernels` only through the install's package-dir mapping).
Loads kernels/ under that name; does nothing when it already imports. Only tests/gpu uses it: the lab
scripts run against the installed package (`pip install --no-deps --no-build-isolation -e .`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def ensure_rlkit_kernels() -> None:
    import rlkit

    try:
        importlib.import_module("rlkit.kernels")
        return
    except ModuleNotFoundError:
        pass
    root = Path(__file__).resolve().parents[2] / "kernels"
    spec = importlib.util.spec_from_file_location("rlkit.kernels", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlkit.kernels"] = module
    spec.loader.exec_module(module)
    rlkit.kernels = module
