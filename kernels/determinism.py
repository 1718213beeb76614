"""Backward passes that repeat bit for bit: torch's deterministic algorithms, switched on only around the
backward calls that need them.

Why: a run resumes by replaying the steps committed after its last checkpoint, and the replay must give the
stored weights bit for bit (rlkit/rundir.py). On the H200 it did not (2026-12-02, tests/gpu/
test_resume_gpu.py: step 2's weight checksum came out different, its rollout and recompute the same): the
attention backward is FlashAttention's, whose dQ is summed over key blocks with atomic adds in whatever
order the blocks finish, and a GQA model's K/V expansion sums its gradient with atomic index adds. Under
`torch.use_deterministic_algorithms(True)` both take their fixed-order forms (flash: one program walks
the key blocks of a query block in order).

Why scoped and not process-wide: process-wide, every cuBLAS call alerts unless CUBLAS_WORKSPACE_CONFIG was
set before CUDA started (it would change the native GEMMs' workspace, and their speed), and every
`torch.empty` is filled with NaN. Inside the scope only attention's backward runs: flash and the index
adds, no cuBLAS; the NaN fill is switched off there (flash writes every element of its outputs).

The flag is process-global for as long as the scope lasts, so nothing may run on another thread in the
meantime that would alert under it; rlkit's trainer and engine share no threads (the Ray runner puts them
in separate processes).
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils.deterministic


@contextlib.contextmanager
def deterministic_algorithms():
    """torch's deterministic algorithms (not warn-only: warn-only leaves flash's backward on its atomic
    form) inside the block; the caller's settings restored after it, whatever happens."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
