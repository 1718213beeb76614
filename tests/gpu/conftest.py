"""GPU tests (each module is marked `gpu`: skipped without CUDA by tests/conftest.py). The bootstrap
makes `rlkit.kernels` importable on a machine where rlkit is not pip-installed (the H200)."""

from tests.gpu.bootstrap import ensure_rlkit_kernels

ensure_rlkit_kernels()
