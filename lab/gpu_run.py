"""The one script a device call runs: environment check, GPU tests, benchmarks; logs under $OUT.

    python3 -m pip install -q --no-deps --no-build-isolation -e .   # once per fresh machine, offline
    RLKIT_COMMIT=<sha> python3 lab/gpu_run.py [--tests-only | --bench-only] [--quick]

Runs against the installed package (the editable install maps kernels/ to rlkit.kernels; see
docs/VALIDATION.md for why it works offline on the lent H200).
Writes $OUT/gpu_tests.log (pytest -rA -s output: every bitwise report and the native controls),
$OUT/env.txt, and the benchmark rows ($OUT/bench.jsonl, bench.csv, BENCHMARKS.md). Prints a short
table last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: pytest's working directory

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests-only", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--pytest-args", default="")
    ap.add_argument("--test-timeout", type=int, default=300)
    ap.add_argument("--parts", default="gemm,attention,logprob,rowwise,engine")
    ap.add_argument("--gemm-layers", default="", help="only these projections, e.g. o,down")
    ap.add_argument("--gemm-m", default="", help="only these token counts, e.g. 256,1024,4096")
    a = ap.parse_args()
    out = Path(os.environ.get("OUT", "gpu-out"))
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import triton

    env = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"triton {triton.__version__}",
           f"device {torch.cuda.get_device_name()} sms={torch.cuda.get_device_properties(0).multi_processor_count}"]
    for mod in ("safetensors", "transformers", "numpy"):
        try:
            m = __import__(mod)
            env.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001
            env.append(f"{mod} MISSING {exc!r}")
    (out / "env.txt").write_text("\n".join(env) + "\n")
    print("\n".join(env), flush=True)

    rc = 0
    if not a.bench_only:
        t0 = time.time()
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-s", "-p", "no:cacheprovider", "tests/gpu",
               *a.pytest_args.split()]
        envp = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            res = subprocess.run(cmd, cwd=ROOT, env=envp, capture_output=True, text=True, timeout=a.test_timeout)
            log, rc = res.stdout + res.stderr, res.returncode
        except subprocess.TimeoutExpired as exc:
            log, rc = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), 124
            log += f"\nTIMEOUT after {a.test_timeout} s"
        (out / "gpu_tests.log").write_text(log)
        keep = [ln for ln in log.splitlines() if ln.startswith(("PASSED", "FAILED", "ERROR", "qwen3", "cuBLAS", "SDPA"))
                or " passed" in ln or " failed" in ln or "AssertionError" in ln]
        print("\n".join(keep[-60:]), flush=True)
        print(f"gpu tests rc={rc} in {time.time() - t0:.0f} s", flush=True)
    if not a.tests_only:
        from rlkit.bench.kernels import run

        rows = run(out, quick=a.quick, tune=a.tune, parts=tuple(a.parts.split(",")),
                   gemm_layers=tuple(filter(None, a.gemm_layers.split(","))) or None,
                   gemm_ms=tuple(int(v) for v in a.gemm_m.split(",") if v) or None)
        from rlkit.bench.kernels import render

        print(render([r for r in rows if r["op"] != "gemm" or r["metric"] != "plan"]), flush=True)
        _print_tuning(rows)
    return rc


def _print_tuning(rows: list[dict]) -> None:
    """Per GEMM cell: the default plan's ratio, the best candidate's, and any candidate with other bits."""
    cells: dict = {}
    for r in rows:
        if r["op"] == "gemm" and r["metric"] == "ratio_vs_native" and r["impl"].startswith("cfg"):
            cells.setdefault(r["shape"], []).append((r["median"], r["impl"]))
        if r["op"] == "gemm" and r["metric"] == "same_bits" and r["median"] != 1.0:
            print(f"DIFFERENT BITS: {r['impl']} {r['shape']}")
        if r["op"] == "attention_tune":
            print(f"tune attention {r['shape']:44s} {r['impl']:20s} {r['metric']} {r['median']:.3f}")
    for shape, cands in cells.items():
        best = max(cands)
        default = next((r["median"] for r in rows if r["op"] == "gemm" and r["impl"] == "strict"
                        and r["shape"] == shape and r["metric"] == "ratio_vs_native"), float("nan"))
        plan = next((r["metric"][5:] for r in rows if r["op"] == "gemm" and r["impl"] == "strict"
                     and r["shape"] == shape and r["metric"].startswith("plan:")), "?")
        print(f"tune {shape:44s} default {default:.2f} ({plan}) best {best[0]:.2f} {best[1]}")


if __name__ == "__main__":
    raise SystemExit(main())
