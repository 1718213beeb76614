"""GPU tests (each module is marked `gpu`: skipped without CUDA by tests/conftest.py). The device command
installs rlkit first (docs/VALIDATION.md); the bootstrap keeps `pytest tests/gpu` working from a bare copy
of the checkout too (it does nothing where `rlkit.kernels` imports)."""

from tests.gpu.bootstrap import ensure_rlkit_kernels

ensure_rlkit_kernels()
