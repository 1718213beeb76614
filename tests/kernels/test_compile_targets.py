"""Every strict Triton kernel compiles for MI300X (gfx942) and H200 (sm_90) on the CPU, in every launch
plan its plan function chooses (rlkit/bench/compile_targets.py); a compile error, a plan too big for the
target's shared memory, an unknown plan kind or a kernel no plan compiles fails, naming kernel, plan and
target. The negative tests show each of those failures on purpose.

Cost: the whole check over every model preset (each preset's shapes choose their own GEMM tiles from
contract v3 on: 0.6b's narrow layers get other tiles than 8b's; v4's attention runs its own decode and
prefill tiles; the native control's fused kernels) is 231 compiles, 2 forked processes, one fresh compile
cache: 160 s on this 2-core machine beside other work (lab/LOG.md, 2026-12-01 session 3).
`python -m rlkit.bench.compile_targets` writes the same as the report in BENCHMARKS.md.
"""

from __future__ import annotations

import importlib.util
import inspect
import os

import pytest
import torch

from rlkit import NumericsContract, ops
from rlkit.bench import compile_plans, compile_targets
from rlkit.bench.compile_targets import TARGETS, check_one, compile_call, requests, run_check
from rlkit.kernels import _triton as _tr
from rlkit.kernels import gemm, swiglu
from rlkit.native_backends import NATIVE_BACKENDS

GFX942, SM90 = TARGETS


@pytest.fixture(scope="module", autouse=True)
def _fresh_compile_cache(tmp_path_factory):
    """A cold cache, as CI has: nothing compiled before can hide an error."""
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    yield
    if old is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = old


def _call(traits, op: str, kernel: str):
    return next(c for c in compile_plans.kernel_calls(traits, presets=["qwen3-8b"], ops=[op]) if c.kernel == kernel)


def test_every_kernel_and_plan_compiles_for_gfx942_and_sm90():
    results, failures = run_check(jobs=2)
    assert not failures, "compile check failed:\n" + "\n".join(failures)
    for target in TARGETS:
        mine = [r for r in results if r.target is target]
        kernels = {(r.call.op, r.call.kernel) for r in mine}
        launchable = {k for names in compile_plans.launchable_kernels().values() for k in names}
        assert launchable <= {k for _, k in kernels}, f"{target.name}: not compiled {launchable - kernels}"
        reg = "vgprs" if target.backend == "hip" else "registers"
        assert all(r.metrics[reg] > 0 and r.metrics["binary_bytes"] > 0 for r in mine)
        if target.backend == "cuda":  # a cold cache: ptxas ran for every plan and reported its spills
            assert all("spill_store_bytes" in r.metrics for r in mine)
        chosen = [r for r in mine if r.call.chosen]
        assert all(r.metrics["lds_bytes" if target.backend == "hip" else "shared_bytes"]
                   <= target.traits.max_shared_bytes for r in chosen)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_each_target_produces_its_binary(target):
    """The artifacts are real: an AMDGPU ELF (hsaco) for gfx942, a CUDA ELF (cubin) for sm_90."""
    compiled = compile_call(_call(target.traits, "swiglu", "_swiglu_kernel"), target)
    binary = compiled.asm[compile_targets.BINARY[target.backend]]
    assert binary[:4] == b"\x7fELF"
    assert int.from_bytes(binary[18:20], "little") == compile_targets.ELF_MACHINE[target.backend]
    if target.backend == "hip":
        assert {"ttir", "ttgir", "llir", "amdgcn", "hsaco"} <= set(compiled.asm)
        assert "amdgcn-amd-amdhsa--gfx942" in compiled.asm["amdgcn"]
    else:
        assert {"ttir", "ttgir", "llir", "ptx", "cubin"} <= set(compiled.asm)
        assert ".target sm_90a" in compiled.asm["ptx"]


def _broken_swiglu(tmp_path):
    """The real swiglu kernel's source with one name misspelt: it cannot compile."""
    src = inspect.getsource(swiglu._swiglu_kernel.fn)
    assert "mask = offs < n\n" in src
    broken = src.replace("mask = offs < n\n", "mask = offs < n_rows\n")
    body = "\n".join(ln for ln in broken.splitlines() if not ln.startswith("@"))
    path = tmp_path / "broken_swiglu.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + body + "\n")
    spec = importlib.util.spec_from_file_location("broken_swiglu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._swiglu_kernel


def test_a_kernel_that_does_not_compile_fails_naming_kernel_plan_and_target(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(swiglu, "_swiglu_kernel", _broken_swiglu(tmp_path))
    rc = compile_targets.main(["--op", "swiglu", "--preset", "qwen3-8b"])
    err = capsys.readouterr().err
    assert rc == 1, err
    fails = [ln for ln in err.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 2, err
    for line, target in zip(fails, ("gfx942 (MI300X)", "sm_90 (H200)")):
        assert "swiglu._swiglu_kernel [elementwise BLOCK=2048 w4]" in line and target in line, line
        assert "does not compile" in line and "n_rows" in line, line


def test_the_h200_gemm_tile_does_not_fit_mi300x_and_the_gfx942_plan_does():
    """Why gemm.plan is target-aware: the 128 x 256 x 3-stage tile asks 96 KB of LDS, MI300X has 64 KB."""
    tiles = _call(GFX942.traits, "gemm", "_gemm_tiles_kernel")
    assert (tiles.kwargs["BN"], tiles.kwargs["num_stages"]) == (128, 2)
    assert check_one(tiles, GFX942).error is None
    h200_plan = dict(tiles.kwargs, BN=256, num_stages=3)
    res = check_one(compile_plans.KernelCall(tiles.op, tiles.fn, tiles.args, h200_plan, "h200 tile", "test"), GFX942)
    assert res.error is not None and "asks 98304 bytes" in res.error and "MI300X gives a program 65536" in res.error


def test_gemm_plan_follows_the_target(monkeypatch):
    """sm_90 gets the TMA kernel (one chain: 128 x 256 tiles at 4096 x 4096) and, for the row-parallel
    ordered merge with many tiles and chunks of at most gemm.GLUON_MAX_K_CHUNK, the Gluon kernel (else the
    Triton kernel's 128 x 128 tiles; with few tiles the Gluon kernel's 64 x 64 ones); gfx942 has no TMA and 64 KB of LDS: pointer-load 128 x 128 tiles, 2
    stages; without a GPU or the interpreter, pointer loads."""
    dev = torch.device("cuda", 0)
    one_chain = dict(chunks=1, k_chunk=4096)
    with _tr.assume_gpu(GFX942.traits):
        amd = gemm.plan(4096, 4096, dev, **one_chain)
    with _tr.assume_gpu(SM90.traits):
        nv = gemm.plan(4096, 4096, dev, **one_chain)
        nv_tree = gemm.plan(4096, 4096, dev, chunks=4, k_chunk=1024, merge="pairwise_tree")
        nv_fold = gemm.plan(4096, 4096, dev, chunks=4, k_chunk=1024, merge="sequential")
        nv_long_chunks = gemm.plan(8192, 4096, dev, chunks=4, k_chunk=3072, merge="sequential")
        nv_few_tiles = gemm.plan(1024, 1024, dev, chunks=4, k_chunk=512, merge="sequential")
        nv_fewer_tiles = gemm.plan(256, 1024, dev, chunks=4, k_chunk=512, merge="sequential")
        nv_m256_long_chunks = gemm.plan(256, 4096, dev, chunks=4, k_chunk=3072, merge="sequential")
        nv_decode_few = gemm.plan(64, 1024, dev, chunks=4, k_chunk=512, merge="sequential")
        nv_decode = gemm.plan(64, 4096, dev, chunks=4, k_chunk=1024, merge="sequential")
        nv_decode_one_chain = gemm.plan(64, 1024, dev, chunks=1, k_chunk=1024)
        nv_without = gemm.plan(4096, 4096, dev, chunks=4, k_chunk=1024, merge="sequential", gluon=False)
        monkeypatch.setattr(gemm._gluon, "AVAILABLE", False)
        nv_no_gluon = gemm.plan(4096, 4096, dev, chunks=4, k_chunk=1024, merge="sequential")
    with _tr.assume_gpu(GFX942.traits):
        amd_fold = gemm.plan(4096, 4096, dev, chunks=4, k_chunk=1024, merge="sequential")
    assert (amd["kind"], amd["BM"], amd["BN"], amd["num_stages"]) == ("tiles", 128, 128, 2)
    assert (nv["kind"], nv["BM"], nv["BN"], nv["num_stages"]) == ("tma", 128, 256, 3)
    assert (nv_tree["kind"], nv_tree["BM"], nv_tree["BN"], nv_tree["stash"]) == ("tma", 128, 128, 1)
    assert nv_fold == dict(kind="gluon", **gemm.GLUON_ROW_PARALLEL)
    for plan in (nv_long_chunks, nv_without, nv_no_gluon):
        assert (plan["kind"], plan["BM"], plan["BN"], plan.get("stash", 0)) == ("tma", 128, 128, 0), plan
    # too few 64 x 128 tiles for two an SM: 64 x 64 ones where they fill the SMs (any chunk length), else
    # the Triton kernel's split; at M <= 64 32-token tiles where chunked programs would not fill the SMs
    assert nv_few_tiles == nv_m256_long_chunks == dict(kind="gluon", **gemm.GLUON_FEW_TILES), nv_few_tiles
    assert nv_fewer_tiles["kind"] == "tma" and nv_fewer_tiles["split"], nv_fewer_tiles
    assert (nv_decode_few["BT"], nv_decode["BT"], nv_decode_one_chain["BT"]) == (32, 64, 64)
    assert amd_fold["kind"] == "tiles", amd_fold
    assert gemm.plan(4096, 4096, torch.device("cpu"), **one_chain)["kind"] == "tiles"
    assert _tr.sm_count(torch.device("cpu")) == 4  # the assumption ended with its block


def test_an_unknown_gemm_plan_kind_fails_naming_it(monkeypatch):
    real = gemm.plan
    monkeypatch.setattr(gemm, "plan", lambda m, n, device, override=None, **kw: (
        dict(kind="persistent_tma", BM=128, BN=256) if m > 64 and not override else real(m, n, device, override,
                                                                                          **kw)))
    _, failures = requests(presets=["qwen3-8b"], ops=["gemm"])
    assert len(failures) == 2 and all("'persistent_tma'" in f and "GEMM_KINDS" in f for f in failures), failures


def test_a_launchable_kernel_no_plan_compiles_fails(monkeypatch):
    monkeypatch.setattr(swiglu, "_swiglu_fused_kernel", swiglu._swiglu_kernel, raising=False)
    _, failures = requests(presets=["qwen3-8b"], ops=["swiglu"])
    assert [f.split(":")[0] for f in failures] == ["swiglu._swiglu_fused_kernel"] * 2, failures


def test_report_block_is_spliced_between_its_markers_only():
    block = compile_targets.render([])
    doc = "# Benchmarks\n\n## GEMM\n| a |\n"
    once = compile_targets.splice(doc, block)
    assert once.startswith(doc) and compile_targets.MARK_START in once
    new_block = block.replace(compile_targets.MARK_END, "x\n" + compile_targets.MARK_END)
    twice = compile_targets.splice(once + "## after\n", new_block)
    assert twice == doc + "\n" + new_block + "## after\n"
    # re-rendering the GEMM tables keeps the compile report
    kept = compile_targets.keep_compile_report(twice, "# Benchmarks\n\n## GEMM\n| b |\n")
    assert "| b |" in kept and "x\n" + compile_targets.MARK_END in kept


def test_native_backend_names_aiter_for_rocm_and_says_it_is_not_exercised():
    hip = NATIVE_BACKENDS["hip"]
    assert hip.name == "amd-aiter" and hip.exercised.startswith("not exercised")
    assert "not wired in" in hip.rlkit_runs
    assert ops.native_backend(torch.device("cpu")).name == "torch-cpu"
    expected = "amd-aiter" if torch.version.hip else "torch-cuda"
    assert ops.native_backend(torch.device("cuda", 0)).name == expected
    with pytest.raises(ValueError, match="no native backend"):
        ops.native_backend(torch.device("meta"))


GLUON_SMEM_TOTAL = {  # the running total in shared memory: one 128 x 256 register accumulator
    "one partition, BK 64, 2 stages": dict(kind="gluon", BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=2,
                                           total_in_smem=True),
    "one partition, BK 32, 4 stages": dict(kind="gluon", BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=4,
                                           BK=32, total_in_smem=True),
    "warp-specialized, BK 32": dict(kind="gluon", warp_specialize=True, BM=128, BN=256, GROUP_M=8, num_warps=8,
                                    num_stages=4, BK=32, total_in_smem=True),
}


@pytest.mark.skipif(not gemm._gluon.AVAILABLE, reason="this Triton has no Gluon Hopper API")
@pytest.mark.parametrize("name", list(GLUON_SMEM_TOTAL))
def test_gluon_total_in_shared_memory_fits_one_h200_program_without_spills(name):
    """The 128 x 256 tile with its running sum in shared memory: a register accumulator alone (no spill
    under ptxas -v) and the fp32 total plus the load ring within what one sm_90 program may have."""
    cfg = GLUON_SMEM_TOTAL[name]
    shape = compile_plans.GemmShape(4096, 4096, 6144, 6, torch.bfloat16, torch.bfloat16)
    [(role, fn, args, kw)] = compile_plans._gemm_gluon(cfg, shape, NumericsContract.default())
    res = check_one(compile_plans.KernelCall("gemm", fn, args, kw, name, "test"), SM90)
    assert res.error is None, res.error
    assert res.metrics["spill_store_bytes"] == 0 and res.metrics["n_spills"] == 0, res.metrics
    fp32_total = 128 * 256 * 4
    assert fp32_total < res.metrics["shared_bytes"] <= SM90.traits.max_shared_bytes, res.metrics


@pytest.mark.parametrize("bk", [24, 48, 96, 160])
def test_k_step_must_be_whole_k16_mmas_dividing_or_divided_by_the_contract_step(bk):
    """A plan's "BK" must be whole k16 MMAs and divide, or be a multiple of, the contract's K step (the
    same k16 MMAs in the same order either way); anything else is refused by name."""
    with pytest.raises(ValueError, match=f"BK={bk}"):
        gemm._k_step(dict(BK=bk), 64)
    assert [gemm._k_step(cfg, 64) for cfg in ({}, dict(BK=32), dict(BK=128))] == [64, 32, 128]


@pytest.mark.skipif(not gemm._gluon.AVAILABLE, reason="this Triton has no Gluon Hopper API")
def test_gluon_tile_of_two_column_parts_holds_both_fp32_tiles_in_registers():
    """128 x 192 as 128 + 64 columns (Gluon's tensors are powers of two): two accumulators and two running
    totals, 192 fp32 registers a thread at 8 warps, compiled for sm_90 without a spill; a width that is
    not a sum of two powers of two is refused by name."""
    from rlkit.kernels import gemm_gluon

    assert gemm_gluon.column_parts(128) == (128, 0) and gemm_gluon.column_parts(192) == (128, 64)
    assert gemm_gluon.column_parts(160) == (128, 32)
    for bad in (224, 200):
        with pytest.raises(ValueError, match=f"BN={bad}"):
            gemm_gluon.column_parts(bad)
    cfg = dict(kind="gluon", BM=128, BN=192, GROUP_M=8, num_warps=8, num_stages=4)
    shape = compile_plans.GemmShape(4096, 4096, 4096, 4, torch.bfloat16, torch.bfloat16)
    [(role, fn, args, kw)] = compile_plans._gemm_gluon(cfg, shape, NumericsContract.default())
    assert kw["SPLIT_N"] is True
    res = check_one(compile_plans.KernelCall("gemm", fn, args, kw, "128 x 192", "test"), SM90)
    assert res.error is None, res.error
    assert res.metrics["spill_store_bytes"] == 0 and res.metrics["n_spills"] == 0, res.metrics
    assert res.metrics["registers"] >= 192, res.metrics
