"""Strict Triton kernels on the GPU: closeness to fp64, and `torch.equal` invariance where it matters.

Run on the H200: `pip install --no-deps --no-build-isolation -e .` then `python -m pytest -q tests/gpu`
(lab/gpu_run.py does it with the benchmarks). Two kinds of assertion, kept apart (STYLE.md rule 2): closeness with a tolerance, and
bitwise invariance with none. Sizes are chosen either side of every launch threshold:
- GEMM (contract v3+: one chain over K for column-parallel layers, four K chunks for row-parallel ones,
  merged in chunk order (v5) or by the pairwise tree (v4); all are tested): M <= 64 runs the swapped decode kernel (token tiles of 16/32/64), M > 64 the
  persistent TMA kernel whose tile shrinks (128x256 -> 64x64) until every SM has a tile, and whose K
  chunks split over C programs when even 64x64 tiles leave SMs idle. Every M in M_SWEEP below is
  compared with the same rows inside a batch of 4096, and every launch configuration (TMA and the
  pointer-load kernels) with every other.
- attention: split 256 / block 32 boundaries (255, 256, 257, 511, 512, 513 keys), fused vs
  split-parallel decode; every decode position of two sequences against their prefill, under v4 (its
  16-row decode tile, several prefill tiles) and v3 (one 64-row tile).
"""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.kernels import attention, attention_kernel, attention_native, gemm, logprob, rms_norm, rope, swiglu
from rlkit.types import AttentionLayout

pytestmark = pytest.mark.gpu
C = NumericsContract.default()
V6 = NumericsContract.named("qwen3-dense-strict-v6")
V5 = NumericsContract.named("qwen3-dense-strict-v5")
V4 = NumericsContract.named("qwen3-dense-strict-v4")
V2 = NumericsContract.named("qwen3-dense-strict-v2")
DEV = "cuda"
M_SWEEP = [1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513,
           1000, 2048, 4096]


def rel(out, ref):
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm())


def randn(*shape, scale=1.0, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEV) * scale).to(dtype)


# -- GEMM ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row_parallel", [False, True])
@pytest.mark.parametrize("m", [1, 64, 300, 2048])
def test_gemm_close_to_fp64(m, row_parallel):
    x, w = randn(m, 4096, seed=1), randn(1536, 4096, scale=0.02, seed=2)
    y = gemm.strict(x, w, C, row_parallel=row_parallel)
    assert y.dtype == torch.bfloat16
    assert rel(y, x.double() @ w.double().T) < 1e-2


@pytest.mark.parametrize("row_parallel", [False, True])
@pytest.mark.parametrize("k, n", [(4096, 4096), (12288, 4096), (1024, 3072), (1024, 151936)])
def test_gemm_rows_do_not_depend_on_the_batch(k, n, row_parallel):
    """Every M of M_SWEEP (every kernel and tile the plan picks, split and persistent) against the same
    rows in a batch of 4096; and rows alone."""
    x, w = randn(4096, k, seed=3), randn(n, k, scale=0.02, seed=4)
    full = gemm.strict(x, w, C, row_parallel=row_parallel)
    kinds = set()
    for m in M_SWEEP:
        y, launches = gemm.triton_launch(x[:m], w, C, 1, torch.bfloat16, row_parallel=row_parallel)
        kinds.update((ln.kernel, ln.plan.get("BM"), ln.plan.get("BN"), ln.plan.get("split")) for ln in launches)
        assert_bitwise_equal(y, full[:m], f"first {m} rows vs inside 4096 (K={k}, N={n}, row_parallel={row_parallel})")
    for r in (0, 17, 4095):
        assert_bitwise_equal(gemm.strict(x[r : r + 1], w, C, row_parallel=row_parallel), full[r : r + 1],
                             f"row {r} alone")
    print(f"K={k} N={n} row_parallel={row_parallel}: plans {sorted(kinds, key=str)}")


CONFIGS = [
    dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=5),
    dict(kind="swapped", BN=64, BT=64, num_warps=4, num_stages=4),
    dict(kind="swapped", BN=128, BT=32, num_warps=4, num_stages=4),
    dict(kind="swapped", BN=16, BT=16, BK=256, num_warps=2, num_stages=3),  # narrow weight tiles, long K steps
    dict(kind="swapped", BN=32, BT=64, BK=128, num_warps=4, num_stages=3),
    dict(kind="tiles", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=4),
    dict(kind="tiles", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=4),
    dict(kind="tiles", BM=64, BN=128, GROUP_M=8, split=False, num_warps=4, num_stages=4),
    dict(kind="tiles", BM=128, BN=256, GROUP_M=8, split=True, num_warps=8, num_stages=3),
    dict(kind="tiles", BM=128, BN=64, GROUP_M=4, split=False, num_warps=4, num_stages=5),
    dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=4),
    dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=3, programs_per_sm=2),
    dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=False, num_warps=4, num_stages=4),
    dict(kind="tma", BM=64, BN=64, GROUP_M=4, split=False, num_warps=4, num_stages=5),
    dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=4),
    dict(kind="tma", BM=64, BN=64, GROUP_M=8, split=True, num_warps=4, num_stages=5),
    dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, stash=1, num_warps=8, num_stages=4),
    dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, stash=2, num_warps=8, num_stages=4),
    dict(kind="tma", BM=128, BN=256, GROUP_M=8, split=False, stash=2, num_warps=8, num_stages=3),
    dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, stash=1, num_warps=4, num_stages=5),
    # the flat loop over (tile, chunk, K step): the accumulator restarts at each chunk's end
    dict(kind="tma", flat=True, BM=64, BN=128, GROUP_M=8, split=False, stash=0, num_warps=8, num_stages=4),
    dict(kind="tma", flat=True, BM=128, BN=64, GROUP_M=8, split=False, stash=0, num_warps=8, num_stages=4),
    dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, stash=1, num_warps=8, num_stages=4),
    dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, stash=2, num_warps=8, num_stages=4),
    # v5's plans: 64 x 128 / 128 x 64 two an SM (two accumulators in registers), the flat loop at 3 stages
    dict(kind="tma", BM=128, BN=64, GROUP_M=8, split=False, num_warps=4, num_stages=4, programs_per_sm=2),
    dict(kind="tma", BM=64, BN=128, GROUP_M=8, split=False, num_warps=4, num_stages=4, programs_per_sm=2),
    dict(kind="tma", flat=True, BM=128, BN=128, GROUP_M=8, split=False, num_warps=8, num_stages=3),
    # the Gluon kernel of the ordered merge (kernels/gemm_gluon.py; other merges and C = 1 fall back to the
    # plan without it): one partition two an SM (the plan's), 128 x 128, and the warp-specialized form
    dict(kind="gluon", BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=4, programs_per_sm=2),
    dict(kind="gluon", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=5),
    dict(kind="gluon", warp_specialize=True, BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=5),
    # the running total in shared memory (one register accumulator): 128 x 256, K steps of 64 and of 32
    dict(kind="gluon", BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=2, total_in_smem=True),
    dict(kind="gluon", BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=4, BK=32, total_in_smem=True),
    dict(kind="gluon", warp_specialize=True, BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=4, BK=32,
         total_in_smem=True),
    # both fp32 tiles in registers at the largest tiles that hold them: 128 x 192 and 128 x 160 (two column
    # parts, two MMAs a K step); N = 192 and 160 leave a partial column tile, and a second part wholly past N
    dict(kind="gluon", BM=128, BN=192, GROUP_M=8, num_warps=8, num_stages=4),
    dict(kind="gluon", BM=128, BN=160, GROUP_M=8, num_warps=8, num_stages=4),
    # few tiles: 64 x 64 two an SM; K loads of 128 (two contract K steps a load, the same k16 MMAs in order)
    dict(kind="gluon", BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=6, programs_per_sm=2),
    dict(kind="gluon", BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=2, BK=128, programs_per_sm=2),
]
ONE_CHAIN_ONLY = [dict(kind="tma", BM=128, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=3),
                  dict(kind="tma", flat=True, BM=128, BN=256, GROUP_M=8, split=False, num_warps=8, num_stages=3)]
"""A 128x256 tile holds one accumulator of 128 registers a thread: the plan never gives it C > 1."""


@pytest.mark.parametrize("contract", [V6, V5, V4], ids=["v6", "v5", "v4"])
@pytest.mark.parametrize("row_parallel", [False, True])
@pytest.mark.parametrize("m", [1, 40, 200, 1000])
def test_gemm_every_launch_configuration_gives_the_same_bits(m, row_parallel, contract):
    """The tile shapes, warps, stages, TMA or pointer loads, persistent or not, and chunk placement are
    layout only: identical bits, under the chained merge (v6: a row-parallel layer is one chain, so the
    one-chain-only tiles apply to it too), the ordered merge (v5) and the pairwise tree (v4)."""
    x, w = randn(m, 4096, seed=5), randn(2048, 4096, scale=0.02, seed=6)
    base = gemm.triton_partial(x, w, contract, 1, torch.bfloat16, config=CONFIGS[0], row_parallel=row_parallel)
    one_chain = not row_parallel or gemm.chained(contract, True)
    for cfg in CONFIGS[1:] + (ONE_CHAIN_ONLY if one_chain else []):
        y = gemm.triton_partial(x, w, contract, 1, torch.bfloat16, config=cfg, row_parallel=row_parallel)
        assert_bitwise_equal(y, base, f"{cfg} vs {CONFIGS[0]} ({contract.name}, row_parallel={row_parallel})")


def test_every_measured_launch_gives_the_plans_bits():
    """Every entry of every launch table made for this GPU's arch (kernels/tuned/, kernels/gemm_tuned.py):
    its launch against the plan's at the first, a middle and the last row count of its range, seeded
    normal inputs at its (K, N). The launcher compares them at first use too; here a wrong entry fails."""
    from rlkit.kernels import gemm_tuned

    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    entries = [(t, e) for t in gemm_tuned.tables() if t.arch == arch for e in t.entries]
    if not entries:
        pytest.skip(f"no launch table for {arch} in {gemm_tuned.TABLE_DIR}")
    for table, e in entries:
        dtype = getattr(torch, e.dtype)
        w, x = randn(e.n, e.k, scale=0.02, seed=31, dtype=dtype), randn(e.rows[1], e.k, seed=32, dtype=dtype)
        for m in sorted({e.rows[0], (e.rows[0] + e.rows[1]) // 2, e.rows[1]}):
            y = gemm.triton_partial(x[:m], w, C, 1, dtype, config=e.config())
            assert_bitwise_equal(y, gemm.triton_partial(x[:m], w, C, 1, dtype),
                                 f"{table.path.name} K={e.k} N={e.n} M={m} {e.config()} vs the plan")


@pytest.mark.parametrize("contract", [V6, V5], ids=["v6", "v5"])
@pytest.mark.parametrize("row_parallel", [False, True])
def test_gemm_signed_zero_sums_agree_across_configurations(row_parallel, contract):
    """A chunk whose every product is -0 (a zero row of x against a weight row of negative values): a
    chain started from a +0 accumulator gives +0 (+0 + -0), one whose first MMA ignores the accumulator
    may give -0. Every launch form (nested or flat loop, any tile) must give the same sign of zero."""
    x, w = randn(300, 4096, seed=25), randn(2048, 4096, scale=0.02, seed=26)
    x[7] = 0.0
    x[100, 1024:2048] = 0.0  # one chunk of a row-parallel layer only
    w[5] = -w[5].abs() - 1e-3
    w[900] = w[900].abs() + 1e-3  # +0 products: +0 either way
    base = gemm.triton_partial(x, w, contract, 1, torch.bfloat16, config=CONFIGS[0], row_parallel=row_parallel)
    print(f"row 7 x weight row 5: {base[7, 5].item()!r} (sign bit {torch.signbit(base[7, 5]).item()})")
    one_chain = not row_parallel or gemm.chained(contract, True)
    for cfg in CONFIGS[1:] + (ONE_CHAIN_ONLY if one_chain else []):
        y = gemm.triton_partial(x, w, contract, 1, torch.bfloat16, config=cfg, row_parallel=row_parallel)
        assert_bitwise_equal(y, base, f"{cfg} vs {CONFIGS[0]} (row_parallel={row_parallel}), signed zeros")
    for m in (1, 8, 300):  # the plans rlkit picks for a row alone, decode and prefill
        y = gemm.strict(x[:m] if m > 7 else x[7:8], w, contract, row_parallel=row_parallel)
        assert_bitwise_equal(y, base[:m] if m > 7 else base[7:8], f"default plan, M={m}, signed zeros")


@pytest.mark.parametrize("m, k, n", [(1000, 2048, 2048), (2048, 2048, 1024), (4097, 2048, 1024), (1000, 4096, 4096),
                                     (4097, 4096, 4096), (2048, 2048, 1000)])
def test_gemm_plan_runs_row_parallel_on_gluon_with_the_triton_kernels_bits(m, k, n):
    """Where gemm.plan picks the Gluon kernel (sm_90, the ordered merge, many tiles, short chunks), its
    bits are the Triton kernel's (M and N both off the tile grid too), the sign of zero included (x's row 7 is zero, weight row 5 negative:
    every product -0), and the first rows alone equal the same rows inside the batch."""
    x, w = randn(m, k, seed=27), randn(n, k, scale=0.02, seed=28)
    x[7] = 0.0
    w[5] = -w[5].abs() - 1e-3
    y, launches = gemm.triton_launch(x, w, V5, 1, torch.bfloat16, row_parallel=True)
    kinds = [ln.kernel for ln in launches]
    by_triton = gemm.triton_partial(x, w, V5, 1, torch.bfloat16, row_parallel=True,
                                 config=dict(kind="tma", BM=128, BN=128, GROUP_M=8, split=False, num_warps=8,
                                             num_stages=4))
    print(f"M={m} K={k} N={n}: {kinds}, row 7 x weight row 5 = {y[7, 5].item()!r}")
    assert kinds == ["gluon"], f"the plan took {kinds} at M={m} K={k} N={n}"
    assert_bitwise_equal(y, by_triton, f"Gluon vs the Triton kernel, M={m} K={k} N={n}")
    for rows in (1, 64, 300):
        assert_bitwise_equal(gemm.strict(x[:rows], w, V5, row_parallel=True), y[:rows], f"first {rows} rows alone")


@pytest.mark.parametrize("m", [1, 64, 300, 2048])
def test_gemm_v4_row_parallel_layers_keep_v2_bits(m):
    """Contracts v3 and v4 changed only the column-parallel GEMMs: a row-parallel layer (the TMA kernel at
    M > 64) gives exactly v2's bits (v2's pointer-load split kernel)."""
    x, w = randn(m, 4096, seed=15), randn(2048, 4096, scale=0.02, seed=16)
    assert_bitwise_equal(gemm.strict(x, w, V4, row_parallel=True), gemm.strict(x, w, V2), f"v4 row-par. vs v2 M={m}")


@pytest.mark.parametrize("m", [1, 8, 64, 300, 2048])
def test_gemm_v5_row_parallel_is_the_ordered_sum_of_chunk_chains(m):
    """v5's row-parallel layer, whatever kernel its plan picks (decode split, TMA in registers or split
    programs), equals ((c0 + c1) + c2) + c3 of the four one-chain products over the K quarters, rounded
    once; and it differs from v4's tree somewhere (a control: the merge rule decides bits)."""
    x, w = randn(m, 4096, seed=17), randn(2048, 4096, scale=0.02, seed=18)
    y, launches = gemm.triton_launch(x, w, V5, 1, torch.bfloat16, row_parallel=True)
    c = [gemm.triton_partial(x[:, s : s + 1024], w[:, s : s + 1024], V5, 1, torch.float32) for s in range(0, 4096, 1024)]
    assert_bitwise_equal(y, (((c[0] + c[1]) + c[2]) + c[3]).bfloat16(), f"v5 M={m} [{launches[0].kernel}] vs ordered fold")
    if m >= 300:
        print(compare(gemm.triton_partial(x, w, V5, 1, torch.float32, row_parallel=True),
                      gemm.triton_partial(x, w, V4, 1, torch.float32, row_parallel=True), f"v5 vs v4 fp32 M={m}"))


def test_gemm_split_combine_is_deterministic():
    """The atomic last-arriver combine: 20 launches give one answer (a race would move bits)."""
    for m in (8, 300):  # the swapped kernel's and the TMA kernel's split combine (row-parallel: 4 chunks)
        x, w = randn(m, 4096, seed=7), randn(1024, 4096, scale=0.02, seed=8)
        first = gemm.strict(x, w, V5, row_parallel=True)
        for i in range(20):
            assert_bitwise_equal(gemm.strict(x, w, V5, row_parallel=True), first, f"M={m} launch {i}")


@pytest.mark.parametrize("contract", [V5, V4], ids=["v5", "v4"])
@pytest.mark.parametrize("m", [8, 100, 1000])
def test_gemm_tensor_parallel_subtrees(contract, m):
    """TP 2 and 4: each shard's pieces (v5: its chunk sums; v4: its subtree), gathered in rank order and
    merged by the contract's rule, equal the unsharded layer's fp32 sum."""
    x, w = randn(m, 4096, seed=9), randn(512, 4096, scale=0.02, seed=10)
    whole = gemm.strict_shard_partials(x, w, contract)[0]
    for tp in (2, 4):
        width = 4096 // tp
        pieces = torch.cat([gemm.strict_shard_partials(x[:, s : s + width], w[:, s : s + width], contract, shards=tp)
                            for s in range(0, 4096, width)])
        assert_bitwise_equal(gemm.merge(pieces, contract), whole, f"TP{tp} pieces vs whole ({contract.name}, M={m})")


NATIVE_CONTROL = """
import torch
from rlkit.bitwise import compare
g = torch.Generator(device="cuda")
x = (torch.randn(4096, 4096, generator=g.manual_seed(11), device="cuda")).to(torch.bfloat16)
w = (torch.randn(4096, 4096, generator=g.manual_seed(12), device="cuda") * 0.02).to(torch.bfloat16)
full = x @ w.T
reports = [compare(x[:m] @ w.T, full[:m], f"cuBLAS first {m}") for m in (1, 8, 64, 256, 1000)]
print("\\n".join(map(str, reports)))
print("ANY_DIFFER", any(not r.equal for r in reports))
"""


def test_gemm_native_control_differs():
    """Negative control: cuBLAS at torch's defaults (a process with RLKIT_GEMM_CUBLAS=0, so rlkit leaves
    the workspace alone) gives a row alone other bits than inside a batch (printed). In rlkit's own
    processes cuBLAS runs without a workspace (kernels/gemm_cublas.py); that is the route's business."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE")}
    env["RLKIT_GEMM_CUBLAS"] = "0"
    out = subprocess.run([sys.executable, "-c", NATIVE_CONTROL], env=env, capture_output=True, text=True)
    print(out.stdout, out.stderr[-2000:])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ANY_DIFFER True" in out.stdout, "native was invariant here; the control shows nothing"


# -- logprob ------------------------------------------------------------------------------------------
def test_logprob_out_of_range_id_is_a_clear_error_not_a_device_fault():
    """The fused path (its lm_head on the cuBLAS route) refuses a bad id with OpInputError (read once its
    kernels are queued: they read no id out of bounds), and the device stays usable after it."""
    from rlkit.kernels.errors import OpInputError

    h, w = randn(4, 1024, seed=30), randn(5000, 1024, scale=0.02, seed=31)
    for bad in ([0, 1, 5000, 2], [0, -1, 3, 2]):
        with pytest.raises(OpInputError, match="token ids must lie in"):
            logprob.triton_logprob(h, w, torch.tensor(bad, device=DEV), C)
    good = torch.tensor([0, 1, 4999, 2], device=DEV)
    expected = logprob.triton_from_logits(gemm.triton_partial(h, w, C, 1, torch.float32), good, C)
    assert_bitwise_equal(logprob.triton_logprob(h, w, good, C), expected, "after the errors")
    # ids the caller vouches for skip the check (no device sync); a wrong voucher reads nothing out of
    # bounds: NaN for that row, the other rows' bits unchanged, both kernel forms
    z = gemm.triton_partial(h, w, C, 1, torch.float32)
    for parallel in (False, True):
        out = logprob.triton_from_logits(z, torch.tensor([0, 1, 5000, 2], device=DEV), C, parallel=parallel,
                                         ids_in_range=True)
        assert torch.isnan(out[2]), out
        assert_bitwise_equal(out[[0, 1, 3]], expected[[0, 1, 3]], f"unchecked ids, parallel={parallel}")


def test_logprob_close_fused_equals_engine_path_and_rows_invariant():
    h, w = randn(700, 1024, seed=13), randn(151_936, 1024, scale=0.02, seed=14)
    ids = torch.randint(0, 151_936, (700,), device=DEV)
    lp = logprob.strict(h, w, ids, C)
    ref = torch.log_softmax(h.double() @ w.double().T, -1).gather(-1, ids[:, None]).squeeze(-1)
    assert float((lp.double() - ref).abs().max()) < 5e-2  # bf16 inputs, fp32 logits of one bf16 GEMM
    # the engine: fp32 logits of the sampled rows, then logprob one row at a time
    for r in (0, 63, 64, 699):
        lg = logprob.strict_logits(h[r : r + 1], w, C)
        assert_bitwise_equal(logprob.strict_from_logits(lg, ids[r : r + 1], C), lp[r : r + 1], f"engine row {r}")
    for m in (1, 16, 65, 300):  # below the SM count a row's vocab chunks run in parallel, at 700 in one program
        assert_bitwise_equal(logprob.strict(h[:m], w, ids[:m], C), lp[:m], f"first {m} rows vs 700")
    lg = logprob.strict_logits(h, w, C)
    assert_bitwise_equal(logprob.triton_from_logits(lg, ids, C, parallel=True),
                         logprob.triton_from_logits(lg, ids, C, parallel=False), "700 rows: chunks in parallel vs not")


def test_logprob_processed_rows_invariant():
    from rlkit.types import SamplingParams
    h, w = randn(40, 512, seed=15), randn(20_000, 512, scale=0.05, seed=16)
    ids = torch.randint(0, 20_000, (40,), device=DEV)
    for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3, top_k=50)):
        lg = logprob.strict_logits(h, w, C)
        full = logprob.strict_from_logits(lg, ids, C, params)
        for r in (0, 39):
            assert_bitwise_equal(logprob.strict_from_logits(lg[r : r + 1], ids[r : r + 1], C, params), full[r : r + 1],
                                 f"{params} row {r}")


# -- RMSNorm, SwiGLU, RoPE ----------------------------------------------------------------------------
@pytest.mark.parametrize("h", [128, 1024, 4096])
def test_rms_norm_close_and_invariant(h):
    x, r = randn(3000, h, seed=17), randn(3000, h, seed=18)
    w = (1 + 0.1 * randn(h, dtype=torch.float32, seed=19)).bfloat16()
    y, s = rms_norm.strict(x, w, 1e-6, C, r)
    s64 = x.double() + r.double()
    ref = w.double() * s64 / torch.sqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert rel(y, ref) < 1e-2
    assert_bitwise_equal(s, x + r, "residual add = bf16 add")
    for m in (1, 31, 32, 33, 1000):
        ym, _ = rms_norm.strict(x[:m], w, 1e-6, C, r[:m])
        assert_bitwise_equal(ym, y[:m], f"first {m} rows (H={h})")


def test_swiglu_and_rope_close_and_invariant():
    g, u = randn(1000, 3072, seed=20), randn(1000, 3072, seed=21)
    y = swiglu.strict(g, u, C)
    assert rel(y, g.double() * torch.sigmoid(g.double()) * u.double()) < 1e-2
    assert_bitwise_equal(swiglu.strict(g[7:8], u[7:8], C), y[7:8], "swiglu row alone")
    x = randn(500, 32, 128, seed=22)
    pos = torch.randint(0, 40_000, (500,), device=DEV)
    out = rope.strict(x, pos, 1e6, C)
    assert rel(out, rope.reference(x.cpu(), pos.cpu(), 1e6, C).to(DEV)) < 1e-2
    assert_bitwise_equal(rope.strict(x[3:4], pos[3:4], 1e6, C), out[3:4], "rope token alone")


# -- attention ----------------------------------------------------------------------------------------
H, G, D = 32, 8, 128


def qkv(n, seed):
    return randn(n, H, D, seed=seed), randn(n, G, D, seed=seed + 1), randn(n, G, D, seed=seed + 2)


def prefill(seqs, mode=None):
    q = torch.cat([s[0] for s in seqs]); k = torch.cat([s[1] for s in seqs]); v = torch.cat([s[2] for s in seqs])
    cu = torch.tensor([0] + [len(s[0]) for s in seqs], device=DEV).cumsum(0)
    return attention.triton_attention(q, k, v, AttentionLayout.prefill(cu), C, mode)


def test_attention_close_to_fp64():
    q, k, v = qkv(700, 30)
    out = prefill([(q, k, v)])
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    kd, vd = kd.repeat_interleave(H // G, 0), vd.repeat_interleave(H // G, 0)
    s = qd @ kd.transpose(1, 2) * D ** -0.5
    s = s.masked_fill(torch.ones(700, 700, dtype=torch.bool, device=DEV).triu(1), float("-inf"))
    ref = (torch.softmax(s, -1) @ vd).transpose(0, 1)
    assert rel(out, ref) < 1e-2


class Paged:
    """A paged cache, page 16 (the engine's), pages handed out shuffled; unwritten slots hold NaN."""

    def __init__(self, pages=400, page=16):
        self.k = torch.full((pages, page, G, D), float("nan"), device=DEV, dtype=torch.bfloat16)
        self.v = self.k.clone()
        self.free = torch.randperm(pages).tolist()
        self.page, self.tables = page, {}

    def write(self, sid, start, k, v):
        table = self.tables.setdefault(sid, [])
        while (start + len(k) + self.page - 1) // self.page > len(table):
            table.append(self.free.pop())
        pos = torch.arange(start, start + len(k))
        pages = torch.tensor(table, device=DEV)[pos // self.page]
        self.k[pages, pos % self.page] = k
        self.v[pages, pos % self.page] = v

    def attend(self, q, sids, q_lens, ctx, mode=None):
        width = max(len(self.tables[s]) for s in sids)
        bt = torch.tensor([self.tables[s] + [0] * (width - len(self.tables[s])) for s in sids], device=DEV)
        lay = AttentionLayout.paged(torch.tensor(q_lens, device=DEV), torch.tensor(ctx, device=DEV), bt)
        return attention.triton_attention(q, self.k, self.v, lay, C, mode)


@pytest.mark.parametrize("n", [255, 256, 257, 513, 1200])
def test_attention_prefill_chunked_decode_agree(n):
    a, b = qkv(n, 40), qkv(300, 50)
    alone = prefill([a])
    assert_bitwise_equal(prefill([b, a])[300:], alone, f"packed after a 300-token sequence (n={n})")
    cache = Paged()
    cache.write("b", 0, b[1], b[2])
    cache.write("a", 0, a[1], a[2])
    # chunked prefill of a in chunks of 100 beside b's decode
    for lo in range(0, n, 100):
        hi = min(lo + 100, n)
        out = cache.attend(torch.cat([b[0][299:300], a[0][lo:hi]]), ["b", "a"], [1, hi - lo], [300, hi])
        assert_bitwise_equal(out[1:], alone[lo:hi], f"chunk [{lo}, {hi}) of {n}")
    for p in sorted({0, 31, 32, 255, 256, n - 1} & set(range(n))):
        for mode in ("fused", "split"):
            out = cache.attend(torch.cat([a[0][p : p + 1], b[0][299:300]]), ["a", "b"], [1, 1], [p + 1, 300], mode)
            assert_bitwise_equal(out[:1], alone[p : p + 1], f"decode at {p} ({mode}) of {n}")


V3 = NumericsContract.named("qwen3-dense-strict-v3")


@pytest.mark.parametrize("contract", [C, V3], ids=["v5", "v3"])
@pytest.mark.parametrize("group", [2, 4])
def test_attention_every_decode_position_equals_prefill(contract, group):
    """Every position of two sequences (700 and 1300 tokens, both sides of splits 256..1024) decoded in
    one paged decode batch (v4: the 16-row decode tile; v3: the 64-row tile), fused and split-parallel,
    against the same rows of their prefill; under v4 also every candidate prefill tile against the
    default. group = query heads per KV head: 2 (qwen3-0.6b / 1.7b) and 4 (qwen3-8b)."""
    heads = G * group
    cache = Paged(pages=260)
    seqs = {}
    for sid, n, seed in (("a", 700, 80), ("b", 1300, 81)):
        q, k, v = randn(n, heads, D, seed=seed), randn(n, G, D, seed=seed + 1), randn(n, G, D, seed=seed + 2)
        seqs[sid] = (q, k, v)
        cache.write(sid, 0, k, v)
    full = {sid: attention.triton_attention(q, k, v, AttentionLayout.prefill(torch.tensor([0, len(q)], device=DEV)),
                                            contract) for sid, (q, k, v) in seqs.items()}
    if contract is C:
        for tile in ((16, 2), (16, 4), (32, 4), (64, 4), (64, 8), (128, 8)):
            for sid, (q, k, v) in seqs.items():
                lay = AttentionLayout.prefill(torch.tensor([0, len(q)], device=DEV))
                for longest_first in (False, True):  # the tiles' start order
                    plan = attention.attention_plan(q.shape, k, lay, contract, tile=tile, longest_first=longest_first)
                    assert_bitwise_equal(attention.launch(plan, q, k, v, contract)[0], full[sid],
                                         f"prefill tile {tile} (longest first {longest_first}) vs the default ({sid})")
    rows = [(sid, p) for sid, (q, _, _) in seqs.items() for p in range(len(q))]
    width = max(len(t) for t in cache.tables.values())
    bt = torch.tensor([cache.tables[sid] + [0] * (width - len(cache.tables[sid])) for sid, _ in rows], device=DEV)
    lens = torch.tensor([p + 1 for _, p in rows], device=DEV)
    q = torch.cat([seqs[sid][0][p : p + 1] for sid, p in rows])
    want = torch.cat([full[sid][p : p + 1] for sid, p in rows])
    lay = AttentionLayout.paged_decode(lens, bt)
    for mode in ("fused", "split"):
        assert_bitwise_equal(attention.triton_attention(q, cache.k, cache.v, lay, contract, mode), want,
                             f"{len(rows)} decode positions ({mode}) vs prefill")
        # the key blocks a tile sees whole, with and without masks: the same values
        # (attention_kernel._block_step; the plan takes one form for prefill and fused decode, the other
        # for the split-parallel decode)
        for unmasked in (False, True):
            plan = attention.attention_plan(q.shape, cache.k, lay, contract, mode, unmasked_full=unmasked)
            assert_bitwise_equal(attention.launch(plan, q, cache.k, cache.v, contract)[0], want,
                                 f"{len(rows)} decode positions ({mode}, unmasked full blocks {unmasked}) vs prefill")
        for tile in ((16, 2), (16, 4), (16, 8)) if contract is C else ():  # decode tiles a plan may take
            plan = attention.attention_plan(q.shape, cache.k, lay, contract, mode, tile=tile)
            assert_bitwise_equal(attention.launch(plan, q, cache.k, cache.v, contract)[0], want,
                                 f"{len(rows)} decode positions ({mode}, tile {tile}) vs prefill")
    for sid, (sq, sk, sv) in seqs.items():
        lay = AttentionLayout.prefill(torch.tensor([0, len(sq)], device=DEV))
        for unmasked in (False, True):
            plan = attention.attention_plan(sq.shape, sk, lay, contract, unmasked_full=unmasked)
            assert_bitwise_equal(attention.launch(plan, sq, sk, sv, contract)[0], full[sid],
                                 f"prefill, unmasked full blocks {unmasked}, vs the default ({sid})")


def test_attention_native_decode_differs_from_prefill():
    """Negative control: SDPA decode vs SDPA prefill of the same sequence (printed, counted)."""
    q, k, v = qkv(600, 60)
    cu = torch.tensor([0, 600], device=DEV)
    full = attention.native(q, k, v, AttentionLayout.prefill(cu))
    dec = torch.cat([attention.native(q[p : p + 1], k[: p + 1], v[: p + 1], AttentionLayout(
        torch.tensor([0, 1], device=DEV), torch.tensor([p], device=DEV), torch.tensor([p + 1], device=DEV),
        cu_seqlens_k=torch.tensor([0, p + 1], device=DEV))) for p in range(0, 600, 7)])
    report = compare(dec, full[0:600:7], "SDPA decode vs prefill")
    print(report)


def test_native_paged_decode_is_close_and_is_the_native_path():
    """The native control's paged decode (split-K flash-decoding off the page table): close to SDPA over
    the same keys, what `native()` runs for a paged decode batch on CUDA, and free of the strict tile
    rule (its bits against prefill are printed, not asserted)."""
    cache = Paged()
    seqs = {sid: qkv(n, seed) for sid, n, seed in (("a", 700, 70), ("b", 1300, 71), ("c", 90, 72))}
    for sid, (q, k, v) in seqs.items():
        cache.write(sid, 0, k, v)
    sids = list(seqs)
    width = max(len(cache.tables[s]) for s in sids)
    bt = torch.tensor([cache.tables[s] + [0] * (width - len(cache.tables[s])) for s in sids], device=DEV)
    lens = [len(seqs[s][0]) for s in sids]
    q = torch.cat([seqs[s][0][-1:] for s in sids])
    lay = AttentionLayout.paged_decode(torch.tensor(lens, device=DEV), bt)
    out = attention.native_paged_decode(q, cache.k, cache.v, lay)
    assert_bitwise_equal(attention.native(q, cache.k, cache.v, lay), out, "native() dispatches to it on CUDA")
    ref = attention_native._native_decode(q, cache.k, cache.v, lay)
    assert rel(out, ref) < 1e-2
    strict = torch.cat([prefill([seqs[s]])[-1:] for s in sids])
    print(compare(out, strict, "native paged decode vs strict prefill (control, not asserted)"))
