"""How fast can one fp32 accumulator chain over K run on this GPU: the floor of a one-chain GEMM's time.

Contract v6 makes every output element one chain of k16 MMAs in K order (lab/KERNELS_NOTES.md, v6):
step s+1 adds onto the accumulator step s wrote. At a few rows the chains are few (1.7b down at M <= 8:
N / 16 = 128 of 16 x 8 blocks for 132 SMs), so a chain's step time times K / 16 bounds the call from
below whatever the tiles, the loads or the grid. This probe measures that step time with the operands
already on chip (loaded once, before the loop), so nothing but the chain is timed:

- "mma.sync": Triton's tl.dot on a BN x BT tile at num_warps = BN / 16 (each warp one m16 chain);
- "wgmma wait each": Gluon, one warpgroup MMA of one K step, waited for before the next;
- "wgmma async": Gluon, GROUP dependent warpgroup MMAs of one K step each issued back to back, one wait
  (what a pipelined kernel can do: the chain's order is the hardware's, no wait between steps).

Each at 1 program (the chain alone), one program an SM and two an SM (whether the SM overlaps its
programs' chains). ns a k16 step = median time / (steps x K / 16). Prints a table; rows to OUT.

    RLKIT_COMMIT=<sha> python3 lab/mma_chain_probe.py --out $W/chain
    python lab/mma_chain_probe.py --compile-only     # on a CPU: compiles each variant for sm_90, prints its PTX MMA forms
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import torch
import triton
import triton.language as tl

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    GLUON = True
except Exception:  # noqa: BLE001
    GLUON = False


@triton.jit
def _triton_chain(a_ptr, b_ptr, y_ptr, steps, BN: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """acc <- a @ b + acc, `steps` times, a (BN x BK) and b (BK x BT) loaded once."""
    pid = tl.program_id(0)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rt = tl.arange(0, BT)
    a = tl.load(a_ptr + rn[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BT + rt[None, :])
    acc = tl.zeros((BN, BT), tl.float32)
    for _ in range(steps):
        acc = tl.dot(a, b, acc)
    tl.store(y_ptr + pid * BN * BT + rn[:, None] * BT + rt[None, :], acc)


if GLUON:

    @gluon.jit
    def _gluon_chain(a_ptr, b_ptr, y_ptr, groups, BN: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
                     GROUP: gl.constexpr, num_warps: gl.constexpr):
        """acc <- a @ b + acc, GROUP warpgroup MMAs (K = BK each) issued back to back, then one wait;
        `groups` times. a is BN x BK, b is stored BT x BK (K contiguous) and read transposed."""
        pid = gl.program_id(0)
        blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        ra = gl.arange(0, BN, layout=gl.SliceLayout(1, blocked))
        rb = gl.arange(0, BT, layout=gl.SliceLayout(1, blocked))
        rk = gl.arange(0, BK, layout=gl.SliceLayout(0, blocked))
        a = gl.load(a_ptr + ra[:, None] * BK + rk[None, :])
        b = gl.load(b_ptr + rb[:, None] * BK + rk[None, :])
        a_smem = gl.allocate_shared_memory(gl.bfloat16, [BN, BK], gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16), a)
        b_smem = gl.allocate_shared_memory(gl.bfloat16, [BT, BK], gl.NVMMASharedLayout.get_default_for([BT, BK], gl.bfloat16), b)
        fence_async_shared()
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                              instr_shape=[16, BT, 16])
        acc = gl.zeros((BN, BT), gl.float32, mma_layout)
        for _ in range(groups):
            for _j in gl.static_range(GROUP):
                acc = warpgroup_mma(a_smem, b_smem.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        out = gl.convert_layout(acc, blocked)
        ry = gl.arange(0, BT, layout=gl.SliceLayout(0, blocked))
        gl.store(y_ptr + pid * BN * BT + ra[:, None] * BT + ry[None, :], out)


VARIANTS = {  # name: (kind, BN, BT, BK, num_warps, GROUP)
    "mma.sync 16x8 k16 w1": ("triton", 16, 8, 16, 1, 1),
    "mma.sync 16x16 k16 w1": ("triton", 16, 16, 16, 1, 1),
    "mma.sync 16x8 k256 w1": ("triton", 16, 8, 256, 1, 1),
    "mma.sync 64x8 k256 w1": ("triton", 64, 8, 256, 1, 1),  # four independent chains a warp
    "triton dot 64x16 k256 w4": ("triton", 64, 16, 256, 4, 1),  # Triton picks wgmma here
    "wgmma wait each 64x8 k16": ("gluon", 64, 8, 16, 4, 1),
    "wgmma async 64x8 k16 g16": ("gluon", 64, 8, 16, 4, 16),
    "wgmma async 64x16 k16 g16": ("gluon", 64, 16, 16, 4, 16),
    "wgmma async 64x8 k64 g4": ("gluon", 64, 8, 64, 4, 4),
    "wgmma async 64x64 k16 g16": ("gluon", 64, 64, 16, 4, 16),
    "wgmma async 128x8 k16 g16": ("gluon", 128, 8, 16, 8, 16),
}
STEPS = 4096  # k16 steps a program, each variant


def _launch(name: str, programs: int, a, b, y):
    kind, bn, bt, bk, warps, group = VARIANTS[name]
    per_iter = bk // 16 * group
    if kind == "triton":
        return lambda: _triton_chain[(programs,)](a, b, y, STEPS // per_iter, BN=bn, BT=bt, BK=bk, num_warps=warps)
    return lambda: _gluon_chain[(programs,)](a, b, y, STEPS // per_iter, BN=bn, BT=bt, BK=bk, GROUP=group,
                                             num_warps=warps)


def compile_only() -> None:
    """Compile each variant for sm_90 here (no GPU needed) and print its PTX MMA forms."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    for name, (kind, bn, bt, bk, warps, group) in VARIANTS.items():
        if kind == "gluon" and not GLUON:
            print(f"{name}: no Gluon here")
            continue
        fn = _triton_chain if kind == "triton" else _gluon_chain
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*fp32", ("steps" if kind == "triton" else "groups"): "i32"}
        consts = dict(BN=bn, BT=bt, BK=bk)
        if kind == "gluon":
            from triton.experimental.gluon._runtime import GluonASTSource as source

            consts.update(GROUP=group, num_warps=warps)
        else:
            source = ASTSource
        for c in consts:
            sig[c] = "constexpr"
        try:
            compiled = triton.compile(source(fn, sig, consts), target=target, options=dict(num_warps=warps))
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        ptx = compiled.asm["ptx"]
        ops = sorted(set(re.findall(r"(mma\.sync\.aligned\.\S+|wgmma\.mma_async\.\S+)", ptx)))
        print(f"{name}: {len(ops)} MMA forms {ops[:3]}, {ptx.count('wgmma.wait_group')} waits in the PTX")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        return compile_only()
    from triton.testing import do_bench

    device, commit = torch.cuda.get_device_name(), os.environ.get("RLKIT_COMMIT", "unknown")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    args.out.mkdir(parents=True, exist_ok=True)
    sink = open(args.out / "mma_chain.jsonl", "w")
    a = torch.randn(64 * 256, device="cuda").bfloat16() * 0.01
    b = torch.randn(64 * 256, device="cuda").bfloat16() * 0.01
    y = torch.empty(2 * sms * 64 * 64, device="cuda", dtype=torch.float32)
    print(f"{device}, {sms} SMs, {STEPS} k16 steps a program; ns per k16 step (median)")
    print(f"{'variant':30s} {'1 program':>10s} {'1 an SM':>10s} {'2 an SM':>10s}")
    for name, spec in VARIANTS.items():
        if spec[0] == "gluon" and not GLUON:
            continue
        cells = []
        for programs in (1, sms, 2 * sms):
            try:
                fn = _launch(name, programs, a, b, y)
                fn()
                torch.cuda.synchronize()
                ms = do_bench(fn, warmup=5, rep=50, return_mode="median")
            except Exception as exc:  # noqa: BLE001 - a variant this Triton cannot build: say so, go on
                print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
                break
            ns = ms * 1e6 / STEPS
            cells.append(ns)
            sink.write(json.dumps(dict(op="mma_chain", impl=name, shape=f"programs={programs}", metric="ns_per_k16_step",
                                       median=ns, device=device, commit=commit)) + "\n")
            sink.flush()
        if cells:
            print(f"{name:30s} " + " ".join(f"{c:10.2f}" for c in cells))


if __name__ == "__main__":
    main()
