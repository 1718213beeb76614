"""Contract v6's chained row-parallel GEMM on the H200: which one-chain kernel is fastest at each row count.

For the o/down projections of qwen3-8b / 1.7b / 0.6b and M in --m: v6's strict call (its plan and the
cuBLAS route), the plan's Triton kernel without the route, swapped-kernel variants for M <= 64 (weight
tile, stages), cuBLAS in this process (so without a workspace: rlkit's setting) and v5's ordered merge,
each as a CUDA-graph time on rotating weight copies (rlkit.bench.kernels.cold_graph_ms: the weights from
HBM, as in a forward pass); every variant's bits against the Triton plan first (a difference is printed as
DIFFERENT and the variant not timed). The benchmark (rlkit.bench.kernels) quotes cuBLAS at torch's
defaults; this probe chooses plans.

    RLKIT_COMMIT=<sha> python3 lab/chained_gemm_h200.py --out $W/chained [--m 1,8,64,256,1024,4096,8192]

Writes OUT/chained_gemm.jsonl (long format: op "gemm_chained", impl, shape, metric, median, device, commit;
each variant's launch as a "launch:<json>" row, the cuBLAS route's verdict as "on_cublas"), prints a table
of microseconds, and writes the GPU model's launch table those rows justify to OUT/tuned/<device>.json
(rlkit.bench.gemm_tables; kernels/gemm_tuned.py reads it once it is copied to kernels/tuned/).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

SHAPES = {"qwen3-8b": {"o": (4096, 4096), "down": (12288, 4096)}, "qwen3-1.7b": {"o": (2048, 2048), "down": (6144, 2048)},
          "qwen3-0.6b": {"o": (2048, 1024), "down": (3072, 1024)}}
SWAPPED = {f"sw{bn}x{bt}s{st}": dict(kind="swapped", BN=bn, BT=bt, num_warps=4, num_stages=st)
           for bn in (64, 128) for bt in (16, 64) for st in (4, 6)}
NARROW = {f"nw{bn}x{bt}k{bk}w{wp}s{st}": dict(kind="swapped", BN=bn, BT=bt, BK=bk, num_warps=wp, num_stages=st)
          for bn in (16, 32) for bt in (16, 64) for bk in (128, 256) for wp in (2, 4) for st in (3, 5)
          if (bn + bt) * bk * 2 * st <= 200 * 1024}
"""Narrow weight tiles (16 or 32 rows: more programs for the SMs where one chain over K leaves N / 64 of
them) with longer K steps (more bytes in flight a program): the same k16 MMAs in the same order."""
TOKEN_PADDED = {f"tp{bn}k{bk}s{st}": dict(kind="tiles", BM=64, BN=bn, BK=bk, GROUP_M=8, split=False, num_warps=4,
                                          num_stages=st)
                for bn in (16, 32) for bk in (128, 256) for st in (3, 5) if (64 + bn) * bk * 2 * st <= 200 * 1024}
"""The other orientation at a few rows: the tokens the warpgroup MMA's 64-row operand (rows past M reload
row M - 1 from cache and are never stored), 16 or 32 weight rows its N side, so the narrow tile still
issues warpgroup MMAs (m64n16k16 / m64n32k16) where the swapped 16-row tile issues mma.sync."""

GLUON_ONE_CHAIN = {f"gl{bn}k{bk}s{st}": (dict(BM=64, BN=bn, num_stages=st, GROUP_M=8, num_warps=4), bk)
                   for bn in (16, 32) for bk in (128, 256) for st in (4, 6) if (64 + bn) * bk * 2 * st <= 200 * 1024}
"""Token-padded narrow tiles in Gluon (kernels/gemm_gluon.py at one chunk: one chain over K): TMA loads
STAGES - 1 K steps ahead and the warpgroup MMAs left in flight, where Triton's tiles kernel loads with
pointer loads. x is padded to 64 rows outside the timed call (a TMA box here never exceeds the tensor;
a decode step's static input buffer could hold 64 rows). Not table launches: what the form is worth."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", default="1,8,64,256,1024,4096,8192")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from rlkit import NumericsContract
    from rlkit.bench import gemm_tables
    from rlkit.bench.kernels import cold_graph_ms, cold_weights
    from rlkit.bitwise import compare
    from rlkit.kernels import _triton, gemm, gemm_cublas, gemm_gluon

    v6, v5 = NumericsContract.named("qwen3-dense-strict-v6"), NumericsContract.named("qwen3-dense-strict-v5")
    device, commit = torch.cuda.get_device_name(), os.environ.get("RLKIT_COMMIT", "unknown")
    args.out.mkdir(parents=True, exist_ok=True)
    sink = open(args.out / "chained_gemm.jsonl", "w")  # row by row: a run cut short keeps what it measured

    written = []

    def put(impl, shape, metric, value):
        written.append(dict(op="gemm_chained", impl=impl, shape=shape, metric=metric, median=value,
                            device=device, commit=commit))
        sink.write(json.dumps(written[-1]) + "\n")
        sink.flush()

    g = torch.Generator(device="cuda")
    sms, opts = torch.cuda.get_device_properties(0).multi_processor_count, _triton.launch_options(v6)
    for model, layers in SHAPES.items():
        for layer, (k, n) in layers.items():
            w = (torch.randn(n, k, generator=g.manual_seed(2), device="cuda") * 0.02).bfloat16()
            for m in map(int, args.m.split(",")):
                x = torch.randn(m, k, generator=g.manual_seed(1), device="cuda").bfloat16()
                shape = f"{model}.{layer} M={m} K={k} N={n}"
                ref = gemm.triton_partial(x, w, v6, 1, torch.bfloat16, row_parallel=True)
                gemm.strict(x, w, v6, row_parallel=True)  # eager: the route's check of this shape
                route = gemm_cublas.status(x.device)
                put("v6 strict", shape, "on_cublas", float(route is not None and route.on_cublas(k, n)))
                cands = {"v6 strict": lambda wi: gemm.strict(x, wi, v6, row_parallel=True),
                         "triton plan": lambda wi: gemm.triton_partial(x, wi, v6, 1, torch.bfloat16, row_parallel=True),
                         "cublas in-process": lambda wi: F.linear(x, wi),
                         "v5 strict": lambda wi: gemm.strict(x, wi, v5, row_parallel=True)}
                if m <= 64:
                    variants = {**SWAPPED, **NARROW, **TOKEN_PADDED}
                    for name, cfg in variants.items():
                        if "BT" in cfg and (cfg["BT"] == 16) != (m <= 16):
                            continue
                        cands[name] = (lambda c: lambda wi: gemm.triton_partial(x, wi, v6, 1, torch.bfloat16, config=c,
                                                                                row_parallel=True))(cfg)
                        put(name, shape, "launch:" + json.dumps(cfg, sort_keys=True), 1.0)
                    if gemm_gluon.AVAILABLE:
                        xp = torch.zeros(max(m, 64), k, device="cuda", dtype=x.dtype)
                        xp[:m] = x
                        for name, (cfg, bk) in GLUON_ONE_CHAIN.items():
                            def run(wi, cfg=cfg, bk=bk, xp=xp, m=m):
                                y = torch.empty(xp.shape[0], wi.shape[0], device="cuda", dtype=xp.dtype)
                                gemm_gluon.launch(xp, wi, y, 1, xp.shape[1], bk, cfg, sms, opts)
                                return y[:m]
                            cands[name] = run
                times = {}
                weights = cold_weights(w)
                for name, fn in cands.items():
                    if name not in ("cublas in-process", "v5 strict"):
                        try:
                            out = fn(w)
                        except Exception as e:  # a variant that does not fit (shared memory, registers)
                            print(f"FAILED {shape} {name}: {type(e).__name__}: {str(e)[:120]}")
                            continue
                        rep = compare(out, ref, f"{shape} {name} vs the Triton plan")
                        put(name, shape, "same_bits", float(rep.equal))
                        if not rep.equal:
                            print("DIFFERENT", rep)
                            continue
                    fn(w)
                    times[name] = cold_graph_ms(fn, weights, rep=20) * 1000
                    put(name, shape, "us", times[name])
                best = min((t, nm) for nm, t in times.items() if nm[:2] in ("sw", "nw", "tp", "gl") or nm == "triton plan")
                print(f"{shape:40s} v6 {times['v6 strict']:7.1f}  cublas {times['cublas in-process']:7.1f}  "
                      f"plan {times['triton plan']:7.1f}  best-triton {best[0]:7.1f} ({best[1]})  v5 {times['v5 strict']:7.1f}",
                      flush=True)
    sink.close()
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    try:
        table = gemm_tables.build(written, arch)
    except ValueError as e:
        print(f"no launch table: {e}")
        return
    gemm_tables.write(table, args.out / "tuned")


if __name__ == "__main__":
    main()
