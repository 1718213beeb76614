"""The row-parallel strict GEMM's Gluon kernel (kernels/gemm_gluon.py) against the plan's Triton kernel and
cuBLAS, on the H200: bits first, then time.

For every row-parallel projection (o, down) of the qwen3-8b / 1.7b / 0.6b presets and every M: the plan's
Triton result, each Gluon launch configuration below (its bits against it, the sign of zero included:
x's row 7 is zero and weight row 5 negative; on a difference the count,
the largest difference and the first differing elements are printed and the configuration is not timed),
and CUDA-graph times of all three. cuBLAS runs in this process, so without a workspace (importing rlkit
sets that): at M >= 1024 no split-K was measured there under any setting (lab/KERNELS_NOTES.md), below it
the benchmark's ratio (cuBLAS at torch's defaults, in a child) is the one to quote.

    RLKIT_COMMIT=<sha> python3 lab/gluon_gemm_h200.py --out $W/gluon [--m 256,1024,4096,8192] [--budget-s 150]

Writes OUT/gluon_gemm.jsonl (long format: op "gemm_gluon", impl, shape, metric, median, device, commit)
and prints one line per shape: the plan's and the best configuration's speed against cuBLAS.
Nothing here asserts; a differing configuration is printed as DIFFERENT.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

CONFIGS = {  # name -> plan override (kernels/gemm_gluon.py): each must give the plan's bits
    "g128x128s4": dict(kind="gluon", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=4),
    "g128x128s5": dict(kind="gluon", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=5),
    "g128x128s6": dict(kind="gluon", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=6),
    "g128x64s4": dict(kind="gluon", BM=128, BN=64, GROUP_M=8, num_warps=8, num_stages=4),
    "g128x64s3x2": dict(kind="gluon", BM=128, BN=64, GROUP_M=8, num_warps=8, num_stages=3, programs_per_sm=2),
    "g64x128s4x2": dict(kind="gluon", BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=4, programs_per_sm=2),
    # warp-specialized: one loading warp, the MMA warps meet no CTA-wide barrier around each load
    "w128x128s4": dict(kind="gluon", warp_specialize=True, BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=4),
    "w128x128s5": dict(kind="gluon", warp_specialize=True, BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=5),
    "w128x128s6": dict(kind="gluon", warp_specialize=True, BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=6),
    "w64x128s6": dict(kind="gluon", warp_specialize=True, BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=6),
    "w128x64s6": dict(kind="gluon", warp_specialize=True, BM=128, BN=64, GROUP_M=8, num_warps=8, num_stages=6),
    "g64x128s4x2m16": dict(kind="gluon", BM=64, BN=128, GROUP_M=16, num_warps=4, num_stages=4, programs_per_sm=2),
    # the running total in shared memory: one register accumulator, so 128 x 256 tiles fit
    "t128x256k64s2": dict(kind="gluon", BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=2, total_in_smem=True),
    "t128x256k32s4": dict(kind="gluon", BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=4, BK=32,
                          total_in_smem=True),
    "v128x256k32s4": dict(kind="gluon", warp_specialize=True, BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=4,
                          BK=32, total_in_smem=True),
    "t128x128k64s4": dict(kind="gluon", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=4, total_in_smem=True),
    "t128x128k32s8": dict(kind="gluon", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=8, BK=32,
                          total_in_smem=True),
    # both fp32 tiles in registers at the largest tile that holds them: 128 x 192 over two warpgroups is 96 + 96
    # registers a thread (128 x 256 would be 256); as two column parts (128 + 64; 160 = 128 + 32), two MMAs a step
    "g128x192s4": dict(kind="gluon", BM=128, BN=192, GROUP_M=8, num_warps=8, num_stages=4),
    "g128x192s3": dict(kind="gluon", BM=128, BN=192, GROUP_M=8, num_warps=8, num_stages=3),
    "g128x160s4": dict(kind="gluon", BM=128, BN=160, GROUP_M=8, num_warps=8, num_stages=4),
    "w128x192s4": dict(kind="gluon", warp_specialize=True, BM=128, BN=192, GROUP_M=8, num_warps=8, num_stages=4),
    # few tiles (M <= 1024): more, smaller programs. Gluon 64 x 64 two or three an SM; 128-wide K loads (half
    # the waits, the same k16 MMAs in the same order)
    "g64x64s6x2": dict(kind="gluon", BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=6, programs_per_sm=2),
    "g64x64s4x3": dict(kind="gluon", BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=4, programs_per_sm=3),
    "g64x128k128s2x2": dict(kind="gluon", BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=2, BK=128,
                            programs_per_sm=2),
    "g64x128k32s8x2": dict(kind="gluon", BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=8, BK=32,
                           programs_per_sm=2),
    # the Triton TMA kernel, each chunk its own program (split: the last to arrive adds the four in order) ...
    "p64x64s5": dict(kind="tma", split=True, BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=5),
    "p64x128s4": dict(kind="tma", split=True, BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=4),
    "p128x64s5": dict(kind="tma", split=True, BM=128, BN=64, GROUP_M=8, num_warps=4, num_stages=5),
    "p128x128s4": dict(kind="tma", split=True, BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=4),
    "p128x256s3": dict(kind="tma", split=True, BM=128, BN=256, GROUP_M=8, num_warps=8, num_stages=3),
    # ... or every chunk in one program on 64 x 64 tiles, two or three an SM
    "n64x64s5x2": dict(kind="tma", split=False, BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=5,
                       programs_per_sm=2),
    "n64x64s4x3": dict(kind="tma", split=False, BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=4,
                       programs_per_sm=3),
    # M = 64: the swapped (decode) kernel's other tiles (weight rows x tokens)
    "s64x64s6": dict(kind="swapped", BN=64, BT=64, num_warps=4, num_stages=6),
    "s64x32s4": dict(kind="swapped", BN=64, BT=32, num_warps=4, num_stages=4),
    "s64x16s6": dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=6),
    "s128x64s4": dict(kind="swapped", BN=128, BT=64, num_warps=4, num_stages=4),
    "s128x32s4": dict(kind="swapped", BN=128, BT=32, num_warps=4, num_stages=4),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", default="256,1000,1024,4096,8192")
    ap.add_argument("--models", default="qwen3-8b,qwen3-1.7b,qwen3-0.6b")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--budget-s", type=float, default=150.0)
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from rlkit import NumericsContract
    from rlkit.bench.kernels import _graph_ms, _randn, gemm_shapes
    from rlkit.bitwise import bitwise_equal, compare
    from rlkit.kernels import gemm

    a.out.mkdir(parents=True, exist_ok=True)
    device, commit = torch.cuda.get_device_name(), os.environ.get("RLKIT_COMMIT", "unknown")
    rows: list[dict] = []

    def add(impl, shape, metric, value):
        rows.append(dict(op="gemm_gluon", impl=impl, shape=shape, metric=metric, median=float(value),
                         device=device, commit=commit))

    c = NumericsContract.default()
    t_end = time.time() + a.budget_s
    print(f"{'shape':44s} {'cuBLAS ms':>9s} {'plan':>7s} {'best':>7s}  which", flush=True)
    for model in a.models.split(","):
        for name, (k, n, row_par) in gemm_shapes(model).items():
            if not row_par:
                continue
            w = _randn(n, k, scale=0.02, seed=1)
            w[5] = -w[5].abs() - 1e-3  # with x's zero row 7: every product -0 (the sum's sign of zero is checked)
            for m in map(int, a.m.split(",")):
                if time.time() > t_end:
                    print("budget spent: stopping", flush=True)
                    break
                x = _randn(m, k, seed=2)
                x[7] = 0.0
                shape = f"{model}.{name} M={m} K={k} N={n}"
                y_ref, launches = gemm.triton_launch(x, w, c, 1, torch.bfloat16, row_parallel=True)
                add("triton", shape, "plan:" + str(launches[0].plan.get("kind")), 1.0)
                t_nat = _graph_ms(lambda: F.linear(x, w))
                t_tri = _graph_ms(lambda: gemm.triton_partial(x, w, c, 1, torch.bfloat16, row_parallel=True))
                add("native_no_workspace", shape, "ms", t_nat)
                add("triton", shape, "ms", t_tri)
                add("triton", shape, "ratio_vs_native", t_nat / t_tri)
                best = ("-", 0.0)
                for cname in a.configs.split(","):
                    cfg = CONFIGS[cname]
                    try:
                        y, ln = gemm.triton_launch(x, w, c, 1, torch.bfloat16, config=cfg, row_parallel=True)
                    except Exception as exc:  # noqa: BLE001 - a configuration that does not run is a row
                        print(f"  {shape} {cname}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                        add(cname, shape, "error", 1.0)
                        continue
                    ran = ln[0].kernel if ln else "-"
                    same = bitwise_equal(y, y_ref)  # -0 and +0 differ
                    add(cname, shape, "same_bits", float(same))
                    add(cname, shape, "ran:" + ran, 1.0)
                    if ran == "gluon":
                        add(cname, shape, "registers", ln[0].registers)
                        add(cname, shape, "spills", ln[0].spills)
                    if not same:
                        print(f"  DIFFERENT {compare(y, y_ref, f'{shape} {cname} ({ran})')}", flush=True)
                        continue
                    t = _graph_ms(lambda: gemm.triton_partial(x, w, c, 1, torch.bfloat16, config=cfg,
                                                              row_parallel=True))
                    add(cname, shape, "ms", t)
                    add(cname, shape, "ratio_vs_native", t_nat / t)
                    add(cname, shape, "ratio_vs_triton", t_tri / t)
                    if t_nat / t > best[1]:
                        best = (cname, t_nat / t)
                print(f"{shape:44s} {t_nat:9.4f} {t_nat / t_tri:7.2f} {best[1]:7.2f}  {best[0]}", flush=True)
                del x
            del w
    (a.out / "gluon_gemm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
