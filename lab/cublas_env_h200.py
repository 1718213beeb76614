"""Which process settings give the cuBLAS route its structural guarantee (no split-K), and when they take
effect (issue 16, after lab/cublas_probe_h200.py found cuBLAS without a workspace batch-invariant,
TP-invariant and equal to the strict one-chain bits at every shape and M it measured).

Each case runs in its own process (the workspace variables are read by torch's cuBLAS handle code):
- default: torch's defaults (the control: the canary must show split-K here);
- ws0: CUBLAS_WORKSPACE_CONFIG=:0:0, CUBLASLT_WORKSPACE_SIZE=0 set before torch starts;
- ws16_8: CUBLAS_WORKSPACE_CONFIG=:16:8 (128 KiB, one of the two values torch's deterministic mode
  accepts), CUBLASLT_WORKSPACE_SIZE=0;
- ws0_after_init: ws0's values set after CUDA is initialised (tensors allocated) but before any GEMM;
- ws0_after_mm: ws0's values set after one GEMM has run (is the workspace size read once?).

Per case: the canary (row-parallel shapes whose rows split K under the defaults: rows of M = 1, 8, 64
against the same rows of a 1024-row product), a dense M sweep of column shapes against rlkit's Triton
one-chain kernel (bf16 out, and fp32 out for the lm_head shapes: what logprob reads), whether a GEMM
raises under torch.use_deterministic_algorithms(True), and cuBLAS times at a few shapes.

    RLKIT_COMMIT=<sha> python3 lab/cublas_env_h200.py --out $OUT
Writes OUT/cublas_env.jsonl (one row per case and check) and prints a table. Nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WS0 = {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"}
CASES = {
    "default": ({}, "before"),
    "ws0": (WS0, "before"),
    "ws16_8": ({"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "0"}, "before"),
    "ws0_after_init": (WS0, "after_init"),
    "ws0_after_mm": (WS0, "after_mm"),
}
CANARY = ((12288, 4096), (3072, 1024), (6144, 2048))
COLUMN = {"8b.qkv": (4096, 6144), "0.6b.gate_up": (1024, 6144), "1.7b.qkv": (2048, 4096),
          "8b.gate_up": (4096, 24576)}
LM_HEAD = {"0.6b.lm_head": (1024, 151936), "8b.lm_head": (4096, 151936)}
DENSE_M = tuple(range(1, 130)) + (200, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 3000,
                                  4095, 4096, 4097, 8191, 8192)
LM_M = (1, 2, 7, 8, 16, 17, 63, 64, 65, 200, 256, 1000, 1024, 4096)


def child(case: str, out: Path) -> None:
    env, when = CASES[case]
    if when == "before":
        os.environ.update(env)
    import time

    import torch
    import torch.nn.functional as F

    from rlkit import NumericsContract
    from rlkit.bench.kernels import _graph_ms
    from rlkit.kernels import gemm
    from rlkit.bitwise import differs

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    contract, rows, t0 = NumericsContract.default(), [], time.time()

    def add(check, shape, value, note=""):
        rows.append(dict(case=case, check=check, shape=shape, value=float(value), note=note))

    def randn(*shape, scale=1.0, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    warm = randn(64, 64)
    if when == "after_init":
        os.environ.update(env)
    if when == "after_mm":
        F.linear(warm, warm)
        torch.cuda.synchronize()
        os.environ.update(env)
    for k, n in CANARY:
        x, w = randn(1024, k, seed=2), randn(n, k, scale=0.02, seed=1)
        whole = F.linear(x, w)
        for m in (1, 8, 64):
            add("canary_rows_differing", f"M={m} K={k} N={n}", int(differs(F.linear(x[:m], w), whole[:m]).sum()))
    for label, (k, n) in COLUMN.items():
        x, w = randn(8192, k, seed=2), randn(n, k, scale=0.02, seed=1)
        bad = [m for m in DENSE_M
               if int(differs(F.linear(x[:m], w), gemm.triton_partial(x[:m], w, contract, 1, torch.bfloat16)).sum())]
        add("column_bf16_M_differing_from_strict", f"{label} K={k} N={n}", len(bad), ",".join(map(str, bad[:20])))
        add("cublas_ms", f"{label} M=8 K={k} N={n}", _graph_ms(lambda: F.linear(x[:8], w)))
        add("cublas_ms", f"{label} M=4096 K={k} N={n}", _graph_ms(lambda: F.linear(x[:4096], w)))
    for label, (k, n) in LM_HEAD.items():
        x, w = randn(4096, k, seed=2), randn(n, k, scale=0.02, seed=1)
        bad16, bad32 = [], []
        for m in LM_M:
            strict32 = gemm.triton_partial(x[:m], w, contract, 1, torch.float32)
            try:
                c32 = torch.mm(x[:m], w.t(), out_dtype=torch.float32)
            except Exception as exc:  # noqa: BLE001 - a row saying so
                add("lm_head_fp32_out_failed", label, 1, f"{type(exc).__name__}: {str(exc)[:100]}")
                break
            if int(differs(c32, strict32).sum()):
                bad32.append(m)
            if int(differs(F.linear(x[:m], w), strict32.to(torch.bfloat16)).sum()):
                bad16.append(m)
        add("lm_head_fp32_M_differing_from_strict", f"{label} K={k} N={n}", len(bad32), ",".join(map(str, bad32)))
        add("lm_head_bf16_M_differing_from_strict", f"{label} K={k} N={n}", len(bad16), ",".join(map(str, bad16)))
        add("cublas_fp32_out_ms", f"{label} M=1024", _graph_ms(lambda: torch.mm(x[:1024], w.t(), out_dtype=torch.float32)))
    try:
        torch.use_deterministic_algorithms(True)
        F.linear(warm, warm)
        torch.cuda.synchronize()
        add("deterministic_mode_gemm_raises", "64x64", 0)
    except Exception as exc:  # noqa: BLE001
        add("deterministic_mode_gemm_raises", "64x64", 1, f"{type(exc).__name__}: {str(exc)[:100]}")
    finally:
        torch.use_deterministic_algorithms(False)
    add("seconds", "-", time.time() - t0)
    (out / f"cublas_env-{case}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.child:
        child(a.child, out)
        return 0
    rows = []
    for case in a.cases.split(","):
        env = {k: v for k, v in os.environ.items() if k not in WS0}
        rc = subprocess.run([sys.executable, __file__, "--out", str(out), "--child", case], env=env).returncode
        part = out / f"cublas_env-{case}.jsonl"
        if rc or not part.is_file():
            print(f"case {case}: status {rc}, no rows", flush=True)
            continue
        rows += [json.loads(line) for line in part.read_text().splitlines()]
    (out / "cublas_env.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:
        print(f"{r['case']:15s} {r['check']:40s} {r['shape']:32s} {r['value']:10.4g} {r['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
