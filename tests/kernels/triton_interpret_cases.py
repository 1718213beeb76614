"""Interpreter cases for the Triton kernels (run by tests/kernels/test_triton_interpret.py in a process
with TRITON_INTERPRET=1 set before the kernels are decorated; not collected on its own).

See that module for what is checked and why the inputs are fp32.
"""

import os
import warnings

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal
from rlkit.contract import AttentionSpec, GemmSpec, LogprobSpec, RmsNormSpec
from tests.kernels.chained import ranks_in_turn

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/kernels/test_triton_interpret.py"
C = NumericsContract.named("qwen3-dense-strict-v5")  # the chunked merges (v6 differs only in the GEMM's)
V4 = NumericsContract.named("qwen3-dense-strict-v4")
V6 = NumericsContract.named("qwen3-dense-strict-v6")


def rel(out, ref):
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm())


def g(seed):
    return torch.Generator().manual_seed(seed)


def exact(*shape, seed: int) -> torch.Tensor:
    """fp32 small integers in [-4, 4]: every product and every partial sum of these GEMMs (|sum| <= 16 K
    < 2**24) is an exact fp32 integer, so any summation order gives the same bits. Under the interpreter
    `tl.dot` is numpy's matmul, whose order depends on the BLAS kernel this CPU selects and on the tile
    shape: with these inputs the checks below test indexing, masks, the chunk tree and plan selection on
    every CPU, and say nothing about GPU bits (tests/gpu proves those)."""
    return torch.randint(-4, 5, shape, generator=g(seed)).float()


# -- GEMM ---------------------------------------------------------------------------------------------
GEMM_CONFIGS = [  # small tiles so the interpreter stays quick; every one must give the same result
    dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=2),
    dict(kind="swapped", BN=64, BT=32, num_warps=4, num_stages=2),
    dict(kind="swapped", BN=16, BT=16, BK=128, num_warps=2, num_stages=2),  # 128 where a chunk is whole steps
    dict(kind="swapped", BN=32, BT=16, BK=32, num_warps=2, num_stages=2),
    dict(kind="tiles", BM=64, BN=64, GROUP_M=2, split=True, num_warps=4, num_stages=2),
    dict(kind="tiles", BM=64, BN=64, GROUP_M=2, split=False, num_warps=4, num_stages=2),
    dict(kind="tiles", BM=32, BN=64, GROUP_M=1, split=False, num_warps=4, num_stages=2),
    dict(kind="tiles", BM=64, BN=16, BK=128, GROUP_M=8, split=False, num_warps=4, num_stages=2),  # token-padded narrow
]


@pytest.mark.parametrize("m, k, n", [(1, 256, 96), (5, 160, 70), (70, 512, 130)])
def test_gemm_matches_reference_and_configs_agree(m, k, n):
    """(5, 160, 70): K chunk 40 < k_tile 64 (short masked step), N and M tails. Exact inputs: every
    configuration and the CPU reference must give identical bits (a wrong mask or index would not)."""
    from rlkit.kernels import gemm
    x, w = exact(m, k, seed=1), exact(n, k, seed=2)
    ref = gemm.partial(x, w, C)
    for cfg in GEMM_CONFIGS:
        assert_bitwise_equal(gemm.triton_partial(x, w, C, 1, torch.float32, config=cfg), ref, f"{cfg} vs reference")
    assert_bitwise_equal(gemm.triton_partial(x, w, C, 1, torch.float32, config=GEMM_CONFIGS[4]), ref,
                         "split combine, second launch (counters reset)")
    xr, wr = torch.randn(m, k, generator=g(1)), torch.randn(n, k, generator=g(2))  # real-valued: close
    for cfg in GEMM_CONFIGS:
        assert rel(gemm.triton_partial(xr, wr, C, 1, torch.float32, config=cfg), gemm.partial(xr, wr, C)) < 1e-6


@pytest.mark.parametrize("chunks", [1, 2, 8])
def test_gemm_other_chunk_counts(chunks):
    from rlkit.kernels import gemm
    c = C.replace(gemm=GemmSpec(k_chunks=chunks, chunk_merge="sequential"))
    x, w = exact(9, 512, seed=3), exact(64, 512, seed=4)
    ref = gemm.partial(x, w, c)
    for cfg in (GEMM_CONFIGS[0], GEMM_CONFIGS[2], GEMM_CONFIGS[4], GEMM_CONFIGS[5], GEMM_CONFIGS[6]):
        assert_bitwise_equal(gemm.triton_partial(x, w, c, 1, torch.float32, config=cfg), ref,
                             f"{chunks} chunks, {cfg} vs reference")


def test_gemm_rows_alone_and_tp_subtrees():
    """Plan selection: a row alone takes the swapped (decode) kernel, 70 rows the tiled one; with exact
    inputs both must produce the same row, and two TP shards' subtrees must add up to the whole."""
    from rlkit.kernels import gemm
    x, w = exact(70, 256, seed=5), exact(64, 256, seed=6)
    full = gemm.triton_partial(x, w, C, 1, torch.float32, row_parallel=True)
    for r in (0, 63, 64, 69):
        assert_bitwise_equal(gemm.triton_partial(x[r : r + 1], w, C, 1, torch.float32, row_parallel=True),
                             full[r : r + 1], f"row {r}")
    for contract in (C, V4):
        halves = torch.cat([gemm.triton_shard_partials(x[:, s : s + 128], w[:, s : s + 128], contract, 2)
                            for s in (0, 128)])
        assert_bitwise_equal(gemm.merge(halves, contract), full, f"two TP shards' pieces vs the whole ({contract.name})")


@pytest.mark.parametrize("m", [1, 5, 70])
def test_gemm_v6_row_parallel_is_one_chain_and_tp_ranks_continue_it(m):
    """Contract v6: a row-parallel product runs the one-chain kernels (one launch, C = 1, as a column
    layer), and TP 2 / TP 4 ranks after the first continue the running sum (`_gemm_continue_kernel`, fp32
    start in, at M = 1, 5 and 70) to the whole's bits, rounded once by the last rank."""
    from rlkit.kernels import gemm
    x, w = exact(m, 512, seed=40), exact(136, 512, seed=41)
    y, launches = gemm.triton_launch(x, w, V6, 1, torch.float32, row_parallel=True)
    assert len(launches) == 1 and launches[0].plan["C"] == 1, [ln.plan for ln in launches]
    assert_bitwise_equal(y, gemm.triton_partial(x, w, V6, 1, torch.float32), "row-parallel vs column one chain")
    assert_bitwise_equal(y, gemm.partial(x, w, V6, row_parallel=True), "vs the CPU reference (exact inputs)")
    for tp in (2, 4):
        assert_bitwise_equal(ranks_in_turn(gemm.strict_chain_partial, x, w, V6, tp), y,
                             f"TP {tp} ranks continuing the chain vs one")
    xs, ws = exact(3, 8, seed=42), exact(16, 8, seed=43)  # TP 4 of K = 8: shards of 2, not a multiple of 4
    assert_bitwise_equal(ranks_in_turn(gemm.strict_chain_partial, xs, ws, V6, 4),
                         gemm.partial(xs, ws, V6, row_parallel=True), "TP 4 of K = 8 vs the reference")
    rounded, launches = gemm.continue_launch(x[:, 256:], w[:, 256:], gemm.strict_chain_partial(
        x[:, :256], w[:, :256], V6, None, shards=2), V6, torch.float16)
    assert launches[0].kernel == "continue"
    assert_bitwise_equal(rounded, y.half(), "the continuation rounded once to fp16")


@pytest.mark.parametrize("cfg", [
    dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=2),                        # split combine
    dict(kind="tiles", BM=64, BN=64, GROUP_M=2, split=False, num_warps=4, num_stages=2),   # registers
    dict(kind="tiles", BM=64, BN=64, GROUP_M=2, split=True, num_warps=4, num_stages=2),
    dict(kind="tma", BM=64, BN=64, GROUP_M=2, split=False, num_warps=4, num_stages=2),
    dict(kind="tma", BM=64, BN=64, GROUP_M=2, split=True, num_warps=4, num_stages=2),
    dict(kind="tma", flat=True, BM=64, BN=64, GROUP_M=2, split=False, num_warps=4, num_stages=2)])
def test_gemm_v5_kernels_merge_chunks_in_order(cfg):
    """Real-valued inputs (not the exact integers): every launch form adds v5's four chunk sums as
    ((c0 + c1) + c2) + c3, each c the same launch's one chain over its K quarter (same tiles, so the
    interpreter's dot gives the chain the same bits), and not as v4's tree."""
    from rlkit.kernels import gemm
    dtype = torch.float16 if cfg["kind"] == "tma" else torch.float32
    x, w = torch.randn(70, 512, generator=g(30)).to(dtype), torch.randn(136, 512, generator=g(31)).to(dtype)
    y = gemm.triton_partial(x, w, C, 1, torch.float32, config=cfg, row_parallel=True)
    c = [gemm.triton_partial(x[:, s : s + 128], w[:, s : s + 128], C, 1, torch.float32, config=cfg)
         for s in range(0, 512, 128)]
    assert_bitwise_equal(y, ((c[0] + c[1]) + c[2]) + c[3], f"{cfg}: v5 vs the ordered fold")
    tree = gemm.triton_partial(x, w, V4, 1, torch.float32, config=cfg, row_parallel=True)
    assert_bitwise_equal(tree, (c[0] + c[1]) + (c[2] + c[3]), f"{cfg}: v4 vs the tree")
    assert not torch.equal(y, tree), f"{cfg}: the two merge rules agreed on all {y.numel()} sums"


TMA_CONFIGS = [  # the Hopper TMA kernel (fp16 here: the interpreter computes bf16 dots wrongly)
    dict(kind="tma", BM=64, BN=64, GROUP_M=2, split=False, num_warps=4, num_stages=2),
    dict(kind="tma", BM=32, BN=64, GROUP_M=1, split=False, num_warps=4, num_stages=2, programs_per_sm=1),
    dict(kind="tma", BM=64, BN=32, GROUP_M=2, split=True, num_warps=4, num_stages=2),
    dict(kind="tma", BM=64, BN=64, GROUP_M=2, split=False, stash=1, num_warps=4, num_stages=2),
    dict(kind="tma", BM=32, BN=64, GROUP_M=2, split=False, stash=2, num_warps=4, num_stages=2),
    # the flat loop over (tile, chunk, K step), each place the tree's pending operands can wait
    dict(kind="tma", flat=True, BM=64, BN=64, GROUP_M=2, split=False, stash=0, num_warps=4, num_stages=2),
    dict(kind="tma", flat=True, BM=32, BN=64, GROUP_M=1, split=False, stash=1, num_warps=4, num_stages=2),
    dict(kind="tma", flat=True, BM=64, BN=32, GROUP_M=2, split=False, stash=2, num_warps=4, num_stages=2,
         programs_per_sm=1),
]


@pytest.mark.parametrize("contract", [C, V4], ids=["v5", "v4"])
@pytest.mark.parametrize("n", [130, 136])
@pytest.mark.parametrize("row_parallel", [False, True])
def test_gemm_tma_kernel_persistent_and_split(row_parallel, n, contract):
    """The TMA kernel under the v3 contract: one chain (column-parallel) or the 4-chunk tree
    (row-parallel), persistent (4 programs walk 3 x 3 tiles: M = 70 and N = 130 / 136 end mid-tile) or
    one program per (tile, chunk); every form equals the CPU reference, TP shards add up to the whole,
    and the default plan for 70 rows is this kernel. The flat form stores by TMA: an fp32 output row of
    130 values is not 16-byte aligned, so N = 130 takes the nested form and N = 136 the flat one."""
    from rlkit.kernels import gemm
    x, w = exact(70, 512, seed=13).half(), exact(n, 512, seed=14).half()
    ref = gemm.partial(x, w, contract, row_parallel=row_parallel)
    for cfg in TMA_CONFIGS:
        y, launches = gemm.triton_launch(x, w, contract, 1, torch.float32, config=cfg, row_parallel=row_parallel)
        assert [ln.kernel for ln in launches] == ["tma_flat" if cfg.get("flat") and n % 4 == 0 else "tma"]
        assert_bitwise_equal(y, ref, f"{cfg} vs reference")
    y, launches = gemm.triton_launch(x, w, contract, 1, torch.float16, row_parallel=row_parallel)
    assert launches[0].kernel == "tma" and launches[0].plan["C"] == (4 if row_parallel else 1)
    assert_bitwise_equal(y, ref.half(), "default plan vs reference")
    if row_parallel:
        for cfg in (TMA_CONFIGS[0], TMA_CONFIGS[5]):
            halves = [gemm.triton_partial(x[:, s : s + 256], w[:, s : s + 256], contract, 2, torch.float32,
                                          config=cfg, row_parallel=True) for s in (0, 256)]
            pieces = torch.cat([gemm.triton_shard_partials(x[:, s : s + 256], w[:, s : s + 256], contract, 2)
                                for s in (0, 256)])
            assert_bitwise_equal(gemm.merge(pieces, contract), ref, f"two TP shards' pieces vs the whole, {cfg}")
            assert_bitwise_equal(halves[0] + halves[1], ref, f"two shards' own merges added, {cfg} (exact inputs)")


def test_gemm_gluon_override_runs_the_triton_kernel_where_gluon_cannot():
    """A Gluon launch configuration (kernels/gemm_gluon.py) on CPU tensors under the interpreter, with
    fp32 output, or with contract v4's tree (none of which the Gluon kernel runs): the launcher falls back
    to the plan without it, so the result is the default plan's, from a Triton kernel."""
    from rlkit.kernels import gemm
    x, w = exact(130, 512, seed=15).half(), exact(136, 512, seed=16).half()
    gluon = dict(kind="gluon", BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=4, programs_per_sm=2)
    for contract, out in ((C, torch.float16), (C, torch.float32), (V4, torch.float16)):
        y, launches = gemm.triton_launch(x, w, contract, 1, out, config=gluon, row_parallel=True)
        base = gemm.triton_partial(x, w, contract, 1, out, row_parallel=True)
        assert launches and all(ln.kernel != "gluon" for ln in launches), [ln.kernel for ln in launches]
        assert_bitwise_equal(y, base, f"Gluon override fell back ({contract.name}, {out})")


def test_gemm_measured_launch_is_checked_then_taken(tmp_path, monkeypatch):
    """A GPU model's table entry (kernels/gemm_tuned.py): at the first one-chain product it covers, its
    launch is compared with the plan's at the first and last row count of its range, then taken (and the
    verdict kept); an entry whose launch the contract cannot make (a 48-wide K step) is refused with a
    warning naming it, and the plan runs. Exact inputs, so here the comparison tests the wiring; the GPU
    test compares bits (tests/gpu/test_kernels_gpu.py::test_every_measured_launch_gives_the_plans_bits)."""
    import json

    from rlkit.kernels import gemm, gemm_tuned
    k, n = 512, 96
    narrow = dict(kind="swapped", BN=16, BT=16, BK=128, num_warps=2, num_stages=2)
    table = {"device": "Test GPU", "arch": "sm_90", "entries": [
        {"k": k, "n": n, "rows": [1, 4], "dtype": "float16", "launch": narrow},
        {"k": k, "n": n, "rows": [5, 16], "dtype": "float16", "launch": dict(narrow, BK=48)}]}
    (tmp_path / "Test_GPU.json").write_text(json.dumps(table))
    monkeypatch.setattr(gemm_tuned, "TABLE_DIR", tmp_path)
    monkeypatch.setattr(gemm, "_device_name", lambda device: "Test GPU")
    monkeypatch.setattr(gemm, "_check_input", lambda rows, k, dtype, device: exact(rows, k, seed=17).to(dtype))
    monkeypatch.setattr(gemm, "_MEASURED_CHECKED", {})
    taken = []
    launch = gemm._launch
    monkeypatch.setattr(gemm, "_launch", lambda x, w, c, contract, out, config: taken.append(config) or launch(
        x, w, c, contract, out, config))
    x, w = exact(16, k, seed=18).half(), exact(n, k, seed=19).half()
    y = gemm._one_chain(x[:3], w, V6, torch.float16)
    assert taken == [narrow, None, narrow, None, narrow], taken  # M = 1 and 4 against the plan, then M = 3
    assert_bitwise_equal(y, gemm.triton_partial(x[:3], w, V6, 1, torch.float16), "measured launch vs the plan")
    taken.clear()
    gemm._one_chain(x[:2], w, V6, torch.float16)
    assert taken == [narrow], taken  # the verdict is kept
    taken.clear()
    with pytest.warns(UserWarning, match=r"measured launch .*'BK': 48.* rows 5-16 on Test GPU is refused"):
        y = gemm._one_chain(x[:9], w, V6, torch.float16)
    assert taken[-1] is None, taken  # the plan ran it
    assert_bitwise_equal(y, gemm.triton_partial(x[:9], w, V6, 1, torch.float16), "refused entry: the plan")
    assert gemm._one_chain(x, w, V6, torch.float16).shape == (16, n)
    from rlkit import ops
    status = {s["rows"]: s for s in ops.gemm_measured_launches()}
    assert status[(1, 4)]["taken"] and status[(1, 4)]["launch"] == narrow and status[(1, 4)]["K"] == k
    assert not status[(5, 16)]["taken"] and status[(5, 16)]["out"] == "float16"


# -- RMSNorm, SwiGLU, RoPE ----------------------------------------------------------------------------
@pytest.mark.parametrize("weight_multiply", ["model_dtype", "float32"])
@pytest.mark.parametrize("h", [128, 300])
def test_rms_norm(h, weight_multiply):
    from rlkit.kernels import rms_norm
    c = C.replace(rms_norm=RmsNormSpec(weight_multiply=weight_multiply))
    x, r = torch.randn(37, h, generator=g(7)), torch.randn(37, h, generator=g(8))
    w = 1 + 0.1 * torch.randn(h, generator=g(9))
    y, s = rms_norm.triton_rms_norm(x, w, 1e-6, c, r)
    ry, rs = rms_norm.reference(x, w, 1e-6, c, r)
    assert_bitwise_equal(s, rs, "residual add")
    assert rel(y, ry) < 1e-6
    assert rel(rms_norm.triton_rms_norm(x, w, 1e-6, c), rms_norm.reference(x, w, 1e-6, c)) < 1e-6
    assert_bitwise_equal(rms_norm.triton_rms_norm(x[36:], w, 1e-6, c), rms_norm.triton_rms_norm(x, w, 1e-6, c)[36:],
                         "last row alone (a masked tile)")


def test_swiglu_and_rope():
    from rlkit.kernels import rope, swiglu
    gate, up = torch.randn(5000, generator=g(10)), torch.randn(5000, generator=g(11))
    assert rel(swiglu.triton_swiglu(gate, up, C), swiglu.reference(gate, up, C)) < 1e-6
    x = torch.randn(9, 5, 64, generator=g(12))
    pos = torch.tensor([0, 1, 2, 3, 1000, 1500, 7, 8, 2047])
    assert rel(rope.triton_rope(x, pos, 1e6, C), rope.reference(x, pos, 1e6, C)) < 1e-6


# -- the native control's fused kernels (RMSNorm + residual, RoPE from the cached table, silu * up) ----
@pytest.mark.parametrize("h", [128, 300])
def test_native_rms_norm_close_to_hf_eager(h):
    """Against HF's eager RMSNorm (fp32: the interpreter's bf16 rounding is wrong): the residual sum is
    one add either way (exact), the norm close; 37 rows leave a masked last tile."""
    from rlkit.kernels import rms_norm
    x, r = torch.randn(37, h, generator=g(60)), torch.randn(37, h, generator=g(61))
    w = 1 + 0.1 * torch.randn(h, generator=g(62))
    y, s = rms_norm.triton_native_rms_norm(x, w, 1e-6, r)
    ey, es = rms_norm.native_eager(x, w, 1e-6, r)
    assert_bitwise_equal(s, es, "residual add")
    assert rel(y, ey) < 1e-6
    alone = rms_norm.triton_native_rms_norm(x.view(37, 1, h), w, 1e-6)  # [tokens, heads, D] as q_norm
    assert alone.shape == (37, 1, h) and rel(alone.view(37, h), rms_norm.native_eager(x, w, 1e-6)) < 1e-6


def test_native_swiglu_close_to_hf_eager():
    from rlkit.kernels import swiglu
    gate, up = 4 * torch.randn(5000, generator=g(63)), torch.randn(5000, generator=g(64))
    assert rel(swiglu.triton_native_swiglu(gate, up), swiglu.native_eager(gate, up)) < 1e-6


def test_native_rope_close_to_hf_eager_with_and_without_a_bound():
    """Positions across the cache's 4096-position block (4095, 4096, 9000); with `max_position` the table
    is sized from the bound, without it from the positions: the same rows either way."""
    from rlkit.kernels import rope
    x = torch.randn(9, 5, 64, generator=g(65))
    pos = torch.tensor([0, 1, 2, 3, 1000, 4095, 4096, 8, 9000])
    eager = rope.native_eager(x, pos, 1e6)
    out = rope.triton_native_rope(x, pos, 1e6)
    assert rel(out, eager) < 1e-6
    assert_bitwise_equal(rope.triton_native_rope(x, pos, 1e6, max_position=9001), out, "bounded vs read table")
    cos, _ = rope.native_tables("cpu", torch.float32, 1e6, 64, 12288)
    assert cos.shape == (12288, 64)
    strided = torch.randn(9, 5, 128, generator=g(66))[..., :64]  # a non-contiguous view of q
    assert rel(rope.triton_native_rope(strided, pos, 1e6), rope.native_eager(strided, pos, 1e6)) < 1e-6


# -- the backward both paths share (RMSNorm, SwiGLU) ---------------------------------------------------
@pytest.mark.parametrize("h, rows, programs", [(128, 70, None), (300, 37, None), (128, 200, 2)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_fused_backward_close_to_autograd(h, rows, programs, with_residual, monkeypatch):
    """The fused backward against autograd over HF's eager RMSNorm (fp32): gx, the weight gradient and
    the residual's, with a gradient reaching the sum output too; 300 columns leave masked lanes, 70 and
    37 rows a masked last tile, and 2 programs over 7 tiles walk the row tiles in strides."""
    from rlkit.kernels import rms_norm
    if programs:
        monkeypatch.setattr(rms_norm, "BACKWARD_PROGRAMS", programs)
    x = torch.randn(rows, h, generator=g(90))
    r = torch.randn(rows, h, generator=g(91)) if with_residual else None
    w = 1 + 0.1 * torch.randn(h, generator=g(92))
    gy, gs = torch.randn(rows, h, generator=g(93)), torch.randn(rows, h, generator=g(94))
    gx, gw = rms_norm.triton_backward(x, w, r, 1e-6, gy, gs if with_residual else None)
    ex, ew, er = rms_norm.backward(x, w, r, 1e-6, gy, gs if with_residual else None)  # CPU: autograd
    assert rel(gx, ex) < 1e-5 and rel(gw, ew) < 1e-5, (rel(gx, ex), rel(gw, ew))
    if with_residual:
        assert rel(gx, er) < 1e-5
    again = rms_norm.triton_backward(x, w, r, 1e-6, gy, gs if with_residual else None)
    assert_bitwise_equal(again[1], gw, "the weight gradient's partial rows summed in a fixed order")


def test_swiglu_fused_backward_close_to_the_formula():
    from rlkit.kernels import swiglu
    gate, up, gy = 4 * torch.randn(5000, generator=g(95)), torch.randn(5000, generator=g(96)), torch.randn(5000, generator=g(97))
    dg, du = swiglu.triton_backward(gate, up, gy)
    eg, eu = swiglu.backward(gate, up, gy)  # CPU: torch ops
    assert rel(dg, eg) < 1e-6 and rel(du, eu) < 1e-6, (rel(dg, eg), rel(du, eu))
    leaves = [t.clone().requires_grad_(True) for t in (gate, up)]
    (torch.nn.functional.silu(leaves[0]) * leaves[1]).backward(gy)
    assert rel(dg, leaves[0].grad) < 1e-5 and rel(du, leaves[1].grad) < 1e-5


def test_rope_fused_backward_is_the_inverse_rotation():
    """The native kernel with sin negated against the fp32 formula (autograd's of the rotation), and
    undoing the forward rotation (fp32 tables: up to their rounding)."""
    from rlkit.kernels import rope
    x, gy = torch.randn(9, 5, 64, generator=g(98)), torch.randn(9, 5, 64, generator=g(99))
    pos = torch.tensor([0, 1, 2, 3, 1000, 4095, 4096, 8, 9000])
    fused = rope.triton_native_rope(gy, pos, 1e6, inverse=True)
    # CPU: torch ops over the strict tables, whose angles round differently from HF's at position 9000
    assert rel(fused, rope.backward(gy, pos, 1e6)) < 1e-4
    leaf = x.clone().requires_grad_(True)
    rope.native_eager(leaf, pos, 1e6).backward(gy)
    assert rel(fused, leaf.grad) < 1e-6
    back = rope.triton_native_rope(rope.triton_native_rope(x, pos, 1e6), pos, 1e6, inverse=True)
    assert rel(back, x) < 1e-6


# -- logprob ------------------------------------------------------------------------------------------
SMALL_LP = C.replace(logprob=LogprobSpec(vocab_chunk=1024, row_block=8))


def test_logprob_chunks_tail_and_engine_path(monkeypatch):
    """V = 4321: five vocab chunks of 1024 (the last one short) padded to an 8-leaf tree. 20 rows are one
    GPU row block (its result returned as is) or, with 8-row blocks, three (written into one output)."""
    from rlkit.kernels import logprob
    from rlkit.types import SamplingParams
    h, w = torch.randn(20, 64, generator=g(13)), torch.randn(4321, 64, generator=g(14)) / 2
    ids = torch.randint(0, 4321, (20,), generator=g(15))
    out = logprob.triton_logprob(h, w, ids, SMALL_LP)
    assert float((out - logprob.reference(h, w, ids, SMALL_LP)).abs().max()) < 1e-5
    with monkeypatch.context() as patch:
        patch.setattr(logprob, "GPU_ROW_BLOCK", 8)
        assert_bitwise_equal(logprob.triton_logprob(h, w, ids, SMALL_LP), out, "three row blocks vs one")
    logits = logprob.gemm.strict(h, w, SMALL_LP, torch.float32)  # the logits triton_logprob reduces
    for r in (0, 19):
        assert_bitwise_equal(logprob.triton_from_logits(logits[r : r + 1], ids[r : r + 1], SMALL_LP), out[r : r + 1],
                             f"engine path row {r}")
    for parallel in (False, True):  # a row's chunks in one program, or each in its own then a merge
        assert_bitwise_equal(logprob.triton_from_logits(logits, ids, SMALL_LP, parallel=parallel), out,
                             f"vocab chunks in parallel: {parallel}")
    masked = logits.clone()
    masked[3, 1024:] = float("-inf")  # chunks 1-4 empty: they merge as empty states in either form
    assert_bitwise_equal(logprob.triton_from_logits(masked, ids.clamp(max=1023), SMALL_LP, parallel=True),
                         logprob.triton_from_logits(masked, ids.clamp(max=1023), SMALL_LP, parallel=False),
                         "empty chunks, parallel vs one program a row")
    for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3, top_k=50)):
        a = logprob.triton_from_logits(logits, ids, SMALL_LP, params)
        b = logprob.from_logits(logits, ids, SMALL_LP, params)
        assert torch.equal(torch.isinf(a), torch.isinf(b)), params
        fin = torch.isfinite(b)
        assert not fin.any() or float((a[fin] - b[fin]).abs().max()) < 1e-5, params


def test_row_cumsum_is_close_and_row_invariant():
    """The GPU top-p scan: close to torch's sequential cumsum; a row alone gives the bits it gives in a
    batch; the same call twice gives the same bits (V = 2500: three blocks of 1024, the last short)."""
    from rlkit.kernels import logprob
    x = torch.rand(5, 2500, generator=g(16))
    out = logprob.triton_row_cumsum(x, C)
    assert float((out - torch.cumsum(x, -1)).abs().max()) < 1e-3
    for r in (0, 4):
        assert_bitwise_equal(logprob.triton_row_cumsum(x[r : r + 1], C), out[r : r + 1], f"row {r} alone")
    assert_bitwise_equal(logprob.triton_row_cumsum(x, C), out, "second call")


# -- attention ----------------------------------------------------------------------------------------
SMALL_ATT = C.replace(attention=AttentionSpec(split_size=64, block_size=16))
SMALL_ATT_V3 = NumericsContract.named("qwen3-dense-strict-v3").replace(
    attention=AttentionSpec(split_size=64, block_size=16, split_merge="pairwise_tree", row_sum="tile_reduce"))
ATT_CONTRACTS = {"v4": SMALL_ATT, "v3": SMALL_ATT_V3}
H, KVH, D = 4, 2, 32


@pytest.mark.parametrize("version", ATT_CONTRACTS)
def test_attention_close_to_reference(version):
    """Real-valued inputs: the online softmax, the split states and their merge (v4: folded in order; v3:
    the pairwise tree) are close to the reference (150 tokens cross two split (64) and nine block (16)
    boundaries, beside a 37-token neighbour)."""
    warnings.filterwarnings("ignore")
    from rlkit.kernels import attention
    from rlkit.types import AttentionLayout
    contract = ATT_CONTRACTS[version]
    gen = g(16)
    q, k, v = (torch.randn(187, h, D, generator=gen) for h in (H, KVH, KVH))
    lay = AttentionLayout.prefill(torch.tensor([0, 37, 187]))
    ref = attention.reference(q, k, v, lay, contract)
    for mode in ("fused", "split"):
        assert rel(attention.triton_attention(q, k, v, lay, contract, mode=mode), ref) < 1e-6, mode


@pytest.mark.parametrize("version", ATT_CONTRACTS)
def test_attention_log_sum_exp_rows_close_to_the_scores_and_output_unchanged(version):
    """STORE_LSE: every (token, head) row's log-sum-exp of its scaled visible scores, written through any
    [token, head] strides (flash keeps [heads, tokens] or [tokens, heads]), close to the fp64 logsumexp;
    the output with it equals the output without, bit for bit, fused and split."""
    warnings.filterwarnings("ignore")
    from rlkit.kernels import attention
    from rlkit.types import AttentionLayout
    contract = ATT_CONTRACTS[version]
    gen = g(24)
    q, k, v = (torch.randn(187, h, D, generator=gen) for h in (H, KVH, KVH))
    lay = AttentionLayout.prefill(torch.tensor([0, 37, 187]))
    want = []
    for lo, hi in ((0, 37), (37, 187)):
        kk = k[lo:hi].double().repeat_interleave(H // KVH, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[lo:hi].double(), kk) * D ** -0.5
        s = s.masked_fill(torch.ones(hi - lo, hi - lo, dtype=torch.bool).triu(1), float("-inf"))
        want.append(torch.logsumexp(s, -1).t())
    want = torch.cat(want)
    for mode in ("fused", "split"):
        plain = attention.triton_attention(q, k, v, lay, contract, mode=mode)
        for name, rows in (("[heads, tokens]", torch.full((H, 187), float("nan")).t()),
                           ("[tokens, heads]", torch.full((187, H), float("nan")))):
            out, written = attention.triton_attention(q, k, v, lay, contract, mode=mode, lse=rows)
            assert written
            assert_bitwise_equal(out, plain, f"output with the log-sum-exp stored ({mode}, {name})")
            assert float((rows.double() - want).abs().max()) < 1e-5, (mode, name)


def test_attention_v4_tiles_cover_the_same_queries():
    """Under v4 a plan may pick its tile: 16-row (2 or 4 warps), 32-row and 64-row tiles must map every query
    (tile starts, row masks, split counts per tile). Exact inputs (q = 0, integer values): every tile must
    give the causal means, bit for bit, in prefill and in decode."""
    warnings.filterwarnings("ignore")
    from rlkit.kernels import attention
    from rlkit.types import AttentionLayout
    q, k, v = torch.zeros(150, H, D), exact(150, KVH, D, seed=22), exact(150, KVH, D, seed=23)
    lay = AttentionLayout.prefill(torch.tensor([0, 150]))
    expected = (v.cumsum(0) / torch.arange(1, 151).view(-1, 1, 1)).repeat_interleave(H // KVH, dim=1)
    for tile in ((16, 2), (16, 4), (32, 4), (64, 8)):
        for mode in ("fused", "split"):
            for unmasked in (False, True):
                plan = attention.attention_plan(q.shape, k, lay, SMALL_ATT, mode, tile=tile, unmasked_full=unmasked)
                out, _ = attention.launch(plan, q, k, v, SMALL_ATT)
                assert_bitwise_equal(out, expected, f"tile {tile} ({mode}, unmasked full blocks {unmasked})")
    assert attention.tile_for(SMALL_ATT, True, 2) == attention.DECODE_TILE
    assert attention.tile_for(SMALL_ATT, False, 2) == attention.PREFILL_TILE
    assert attention.tile_for(SMALL_ATT_V3, True, 2) == (attention.BLOCK_M, attention.NUM_WARPS)


@pytest.fixture(params=[False, True], ids=["masked", "unmasked_full"])
def unmasked_full(request):
    """Plans with and without the unmasked path for the key blocks a tile sees whole (every mode: the
    split-parallel decode's own default too)."""
    from rlkit.kernels import attention_kernel
    saved = attention_kernel.UNMASKED_FULL, attention_kernel.UNMASKED_FULL_SPLIT
    attention_kernel.UNMASKED_FULL = attention_kernel.UNMASKED_FULL_SPLIT = request.param
    yield request.param
    attention_kernel.UNMASKED_FULL, attention_kernel.UNMASKED_FULL_SPLIT = saved


@pytest.mark.parametrize("version", ATT_CONTRACTS)
def test_attention_modes_layouts_and_pages_agree(version, unmasked_full):
    """Which keys each query sees, page tables, split/block boundaries, chunked prefill, decode.

    Exact inputs: q = 0 makes every visible score 0, so each softmax weight is exp(0) = 1 and a query's
    output is the mean of the values it sees; values are small integers, so every sum is exact and any
    summation order gives the same bits. A wrong mask, page lookup or split bound changes the mean. (With
    real-valued inputs the interpreter's `tl.dot` -- numpy's BLAS -- orders sums by CPU and tile shape.)
    Pages of 8 are handed out shuffled, unwritten slots are NaN; decode runs on both sides of the splits."""
    warnings.filterwarnings("ignore")
    from rlkit.kernels import attention
    from rlkit.kernels.attention import AttentionLayout
    contract = ATT_CONTRACTS[version]
    gen = g(17)
    a = (torch.zeros(150, H, D), exact(150, KVH, D, seed=18), exact(150, KVH, D, seed=19))
    b = (torch.zeros(37, H, D), exact(37, KVH, D, seed=20), exact(37, KVH, D, seed=21))
    q, k, v = (torch.cat([b[i], a[i]]) for i in range(3))
    lay = AttentionLayout.prefill(torch.tensor([0, 37, 187]))
    out = attention.triton_attention(q, k, v, lay, contract, mode="fused")
    visible = torch.cat([v[:37].cumsum(0) / torch.arange(1, 38).view(-1, 1, 1),
                         v[37:].cumsum(0) / torch.arange(1, 151).view(-1, 1, 1)])  # causal mean per sequence
    expected = visible.repeat_interleave(H // KVH, dim=1)
    assert rel(out, expected) < 1e-6, "outputs are not the causal means of the values (a mask is wrong)"
    assert_bitwise_equal(attention.triton_attention(q, k, v, lay, contract, mode="split"), out, "split vs fused")
    alone = attention.triton_attention(*a, AttentionLayout.prefill(torch.tensor([0, 150])), contract)
    assert_bitwise_equal(out[37:], alone, "packed beside a neighbour vs alone")
    for longest_first in (False, True):  # the order programs start in moves no bit
        plan = attention.attention_plan(q.shape, k, lay, contract, "fused", longest_first=longest_first)
        assert_bitwise_equal(attention.launch(plan, q, k, v, contract)[0], out, f"longest first {longest_first}")
    page, pages = 8, torch.randperm(40, generator=gen)
    kc = torch.full((40, page, KVH, D), float("nan"))
    vc = kc.clone()
    for j in range(150):
        kc[pages[j // page], j % page] = a[1][j]
        vc[pages[j // page], j % page] = a[2][j]
    table = pages[:19].unsqueeze(0)
    for p in (0, 63, 64, 127, 128, 149):
        lay = AttentionLayout.paged(torch.tensor([1]), torch.tensor([p + 1]), table)
        for mode in ("fused", "split"):
            assert_bitwise_equal(attention.triton_attention(a[0][p : p + 1], kc, vc, lay, contract, mode),
                                 alone[p : p + 1], f"decode at {p} ({mode})")
    lay = AttentionLayout.paged(torch.tensor([70]), torch.tensor([130]), table)
    assert_bitwise_equal(attention.triton_attention(a[0][60:130], kc, vc, lay, contract), alone[60:130],
                         "chunked prefill of [60, 130)")


def test_native_paged_decode_matches_the_sdpa_decode():
    """The native control's paged decode kernel (16-row tile, splits in parallel): exact inputs (q = 0,
    integer values), so it must equal the masked SDPA decode's causal means; pages shuffled, NaN past
    each context."""
    warnings.filterwarnings("ignore")
    from rlkit.kernels import attention
    from rlkit.kernels.attention import AttentionLayout
    page, n_pages = 16, 40
    kc = torch.full((n_pages, page, KVH, D), float("nan"))
    vc = kc.clone()
    lens, order = [150, 37, 300], torch.randperm(n_pages, generator=g(30)).tolist()
    tables, vals = [], []
    for i, n in enumerate(lens):
        pages = [order.pop() for _ in range(-(-n // page))]
        k, v = exact(n, KVH, D, seed=31 + i), exact(n, KVH, D, seed=41 + i)
        for j in range(n):
            kc[pages[j // page], j % page], vc[pages[j // page], j % page] = k[j], v[j]
        tables.append(pages + [0] * (19 - len(pages)))
        vals.append(v.mean(0).repeat_interleave(H // KVH, dim=0))
    lay = AttentionLayout.paged_decode(torch.tensor(lens), torch.tensor(tables))
    q = torch.zeros(3, H, D)
    out = attention.native_paged_decode(q.half(), kc.half(), vc.half(), lay)
    assert_bitwise_equal(out.float(), torch.stack(vals).half().float(), "native paged decode vs the value means")


def test_launches_return_their_plan_and_leave_no_module_state():
    """A launcher hands what it launched (kernel, plan, compiled kernel) back to the caller; the kernel
    modules keep no per-launch record."""
    warnings.filterwarnings("ignore")
    from rlkit.kernels import attention, gemm
    from rlkit.types import AttentionLayout
    x, w = torch.randn(5, 128, generator=g(40)), torch.randn(96, 128, generator=g(41))
    y, launches = gemm.triton_launch(x, w, C, 1, torch.float32)
    assert [ln.kernel for ln in launches] == ["swapped"] and launches[0].plan["C"] == C.gemm.column_k_chunks
    assert_bitwise_equal(gemm.triton_partial(x, w, C, 1, torch.float32), y, "triton_partial = triton_launch[0]")
    q, k = torch.randn(20, H, D, generator=g(42)), torch.randn(20, KVH, D, generator=g(43))
    lay = AttentionLayout.prefill(torch.tensor([0, 20]))
    plan = attention.attention_plan(q.shape, k, lay, SMALL_ATT, "split")
    out, launches = attention.launch(plan, q, k, k, SMALL_ATT)
    assert [ln.kernel for ln in launches] == ["split", "merge"]
    assert_bitwise_equal(attention.triton_attention(q, k, k, lay, SMALL_ATT, "split"), out, "launch vs triton_attention")
    assert not hasattr(gemm, "LAST") and not hasattr(attention, "LAST") and not hasattr(gemm, "_RETIRED")
