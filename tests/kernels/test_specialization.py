"""Kernels compile once a configuration, not once a batch composition.

Triton specializes an integer argument on being divisible by 16 or equal to 1 unless told not to: a size
that changes from call to call (rows, tokens, the block table's width) then compiles a new variant the
first time it happens to be a multiple of 16, at any step of a run. Measured on the H200 (lab/LOG.md
2026-12-04 session 21, `rl_step_ratio_h200.py --events`): the strict validation run compiled an attention
kernel in step 4 and the RMSNorm backward in step 5, after two warm-up steps; those steps took 3.4 s and
2.4 s against 1.8-1.9 s. The specialization is an assumption about addresses and masks, never about
arithmetic, so leaving it out moves no bit (the GPU tests run every kernel at sizes on both sides of it).
"""

from __future__ import annotations

import pytest

RUN_VARYING = {  # (module, kernel) -> its integer arguments that change between the calls of one run
    ("attention_kernel", "_attn_kernel"): ("stride_bt", "MAXS"),
    ("rms_norm", "_rms_norm_kernel"): ("n_rows",),
    ("rms_norm", "_native_rms_norm_kernel"): ("n_rows",),
    ("rms_norm", "_rms_norm_backward_kernel"): ("n_rows", "n_tiles"),
    ("gemm_kernels", "_gemm_swapped_kernel"): ("M",),
    ("gemm_kernels", "_gemm_tiles_kernel"): ("M",),
    ("gemm_kernels", "_gemm_tma_kernel"): ("M", "programs"),
    ("gemm_kernels", "_gemm_tma_flat_kernel"): ("M", "programs"),
}


@pytest.mark.parametrize("module,kernel", sorted(RUN_VARYING), ids=lambda v: v)
def test_sizes_that_change_within_a_run_are_not_specialized(module, kernel):
    import importlib

    fn = getattr(importlib.import_module(f"rlkit.kernels.{module}"), kernel)
    params = {p.name: p for p in fn.params}
    specialized = [a for a in RUN_VARYING[(module, kernel)] if not params[a].do_not_specialize]
    assert not specialized, f"{module}.{kernel}: {specialized} would compile a new variant mid-run"


def test_gluon_row_parallel_kernels_do_not_specialize_on_rows():
    from rlkit.kernels import gemm_gluon

    assert gemm_gluon.AVAILABLE, "the test environment's Triton has Gluon's Hopper API (the compile check needs it)"
    for fn in (gemm_gluon._ordered_chunks_kernel, gemm_gluon._ordered_chunks_ws_kernel):
        params = {p.name: p for p in fn.params}
        assert params["M"].do_not_specialize and params["programs"].do_not_specialize
