"""Contract v6's chained row-parallel GEMM on the GPU: o_proj/down_proj are one tensor-core chain over K
(the column layers' kernels, cuBLAS without split-K where its route admits the shape), batch-invariant at
every row count; TP 2 / 4 ranks continuing the running fp32 sum (`_gemm_continue_kernel`) give the whole's
bits, signed zeros included; and the bits differ from v5's ordered merge of from-zero chunks (control)."""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.kernels import gemm, gemm_cublas
from tests.kernels.chained import ranks_in_turn

pytestmark = pytest.mark.gpu
C = NumericsContract.named("qwen3-dense-strict-v6")
V5 = NumericsContract.named("qwen3-dense-strict-v5")
DEV = "cuda"
ROW_PARALLEL_SHAPES = {  # (K, N) of the Qwen3 o_proj and down_proj
    "0.6b.o": (2048, 1024), "0.6b.down": (3072, 1024), "1.7b.o": (2048, 2048), "1.7b.down": (6144, 2048),
    "8b.o": (4096, 4096), "8b.down": (12288, 4096),
}
M_SWEEP = [1, 2, 7, 8, 16, 17, 33, 64, 65, 128, 129, 255, 256, 257, 1000, 1024, 2048, 4096]


def randn(*shape, scale=1.0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEV) * scale).to(torch.bfloat16)


@pytest.mark.parametrize("label", list(ROW_PARALLEL_SHAPES))
def test_row_parallel_is_the_column_one_chain_at_every_row_count(label):
    k, n = ROW_PARALLEL_SHAPES[label]
    x, w = randn(4096, k, seed=1), randn(n, k, scale=0.02, seed=2)
    assert C.gemm.chunk_merge == "chained"
    whole = gemm.strict(x, w, C, row_parallel=True)
    for m in M_SWEEP:
        y = gemm.strict(x[:m], w, C, row_parallel=True)
        assert_bitwise_equal(y, gemm.triton_partial(x[:m], w, C, 1, torch.bfloat16),
                             f"{label}: row-parallel strict vs the column one-chain Triton kernel, M={m}")
        assert_bitwise_equal(y, whole[:m], f"{label}: first {m} rows vs inside 4096")
    state = gemm_cublas.status(DEV)
    print(f"{label}: on cuBLAS {state is not None and state.on_cublas(k, n)}")
    report = compare(whole, gemm.strict(x, w, V5, row_parallel=True), f"{label}: v6 chained vs v5 ordered merge")
    print(report)
    assert not report.equal, "the chained and the ordered merge agreed on every element (control)"


@pytest.mark.parametrize("m", [1, 8, 64, 100, 1000])
@pytest.mark.parametrize("label", ["0.6b.down", "8b.o"])
def test_tp_ranks_continuing_the_running_sum_give_the_whole(label, m):
    k, n = ROW_PARALLEL_SHAPES[label]
    x, w = randn(m, k, seed=3), randn(n, k, scale=0.02, seed=4)
    x[0, k // 2 :] = 0.0  # the second half's products of row 0 with weight row 5 are all -0
    w[5] = -w[5].abs() - 1e-3
    whole = gemm.strict_chain_partial(x, w, C)
    assert_bitwise_equal(whole.bfloat16(), gemm.strict(x, w, C, row_parallel=True), f"{label} fp32 whole vs strict")
    for tp in (2, 4):
        assert_bitwise_equal(ranks_in_turn(gemm.strict_chain_partial, x, w, C, tp), whole,
                             f"{label}: TP{tp} ranks continuing the chain vs one, M={m}")
    start = gemm.strict_chain_partial(x[:, : k // 2], w[:, : k // 2], C, None, shards=2)
    y, launches = gemm.continue_launch(x[:, k // 2 :], w[:, k // 2 :], start, C, torch.bfloat16)
    assert [ln.kernel for ln in launches] == ["continue"]
    assert_bitwise_equal(y, whole.bfloat16(), f"{label}: the continuation rounded once, M={m}")
