"""Probe for a cuBLAS route under the strict contract (issue 16): on this GPU, is cuBLAS's bf16 GEMM (fp32
accumulation, bf16 out, what F.linear runs) batch-invariant, TP-invariant, and equal to rlkit's strict bits?

Why: a contract guarantees invariances on one device kind (../shared/DESIGN.md), not a kernel. If cuBLAS,
under some setting, gives every row the same bits whatever the batch (and a column shard the same bits as
the whole), the column-parallel layers (q/k/v, gate/up, lm_head: one fp32 chain over K in contract v3+)
could run on it behind a start-up self-check that refuses the route when a check fails, and at the bits of
rlkit's Triton kernel when they also agree with it. vLLM's batch-invariant mode relies on cuBLASLt with
split-K disabled being batch-invariant on Hopper; nobody here has measured it on this H200.

Settings, each in its own process (the workspace variables are read when CUDA starts):
- default: torch's defaults;
- no_reduced_reduction: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False;
- no_workspace: that, plus CUBLAS_WORKSPACE_CONFIG=:0:0 and CUBLASLT_WORKSPACE_SIZE=0 (no split-K that
  needs a workspace).

For the Qwen3-8B, 1.7B and 0.6B projection shapes (rlkit.bench.kernels.gemm_shapes) and M in
{1, 8, 64, 256, 1024, 4096, 8192}, every setting records (bitwise counts on the device):
- rows: cuBLAS(x[:M]) against the first M rows of cuBLAS(x) with 8192 rows (differing elements, max |d|);
- tp2 / tp4 (column layers): cuBLAS(x[:M], w's first and last N/t rows) against those columns of the whole;
- strict: cuBLAS(x[:M]) against rlkit's strict kernel (the default contract) on the same rows;
- row-parallel layers (o, down): the contract's K chunks on cuBLAS with fp32 out (`torch.mm(out_dtype=)`),
  added in chunk order, rounded once ("chunked"), and the same with each chunk's add in cuBLAS's epilogue
  (`torch.addmm(running sum, ..., out_dtype=float32)`, beta = 1: "chained"): the same rows / strict counts;
- the time of each (CUDA-graph replay, median ms) and the cuBLAS kernels' names (split-K shows in them).

    python3 -m pip install -q --no-deps --no-build-isolation -e .    # once per fresh machine, offline
    RLKIT_COMMIT=<sha> python3 lab/cublas_probe_h200.py --out $OUT [--models qwen3-0.6b] [--budget-s 150]
    .venv/bin/python lab/cublas_probe_h200.py --dry --out /tmp/cublas   # CPU, tiny shapes: the logic only

Writes OUT/cublas_probe.jsonl and .csv (long format: op, impl, shape, metric, median, device, commit, with
the setting in impl) and prints a table: per setting, the shapes whose rows / tp / strict checks all held,
and the cuBLAS time against the default setting's. Nothing here asserts: it measures.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "default": {},
    "no_reduced_reduction": {},
    "no_workspace": {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "CUBLASLT_WORKSPACE_SIZE": "0"},
}
MS = (1, 8, 64, 256, 1024, 4096, 8192)
MODELS = ("qwen3-8b", "qwen3-1.7b", "qwen3-0.6b")
DRY_SHAPES = {"a": (256, 192, False), "o": (256, 128, True)}
DRY_MS = (1, 8, 40, 130)


def bits_differ(a, b) -> tuple[int, float]:
    """(elements whose bits differ, largest |a - b| among them; rlkit.bitwise.differs), computed where the
    tensors are (rlkit.bitwise.compare copies to the host: gigabytes at the lm_head's M = 8192)."""
    from rlkit.bitwise import differs

    if a.shape != b.shape or a.dtype != b.dtype:
        return a.numel(), float("inf")
    mask = differs(a, b)
    count = int(mask.sum())
    return count, (float((a.float() - b.float()).abs()[mask].max()) if count else 0.0)


def kernel_names(fn) -> str:
    """The CUDA kernels one call of fn launches (torch.profiler), or '?' where the profiler is not usable."""
    import torch

    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return "|".join(dict.fromkeys(n[:90] for n in names)) or "?"
    except Exception as exc:  # noqa: BLE001 - a missing profiler leaves the names out, not the probe
        return f"? ({type(exc).__name__})"


def child(setting: str, out: Path, models, ms, budget_s: float, dry: bool) -> None:
    """One setting's measurements, in this process (its environment was set by the parent)."""
    import torch
    import torch.nn.functional as F

    from rlkit import NumericsContract
    from rlkit.bench.provenance import commit
    from rlkit.kernels import gemm

    if setting != "default":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    device = "cpu" if dry else "cuda"
    name = "cpu (dry run)" if dry else torch.cuda.get_device_name()
    contract, sha, rows = NumericsContract.default(), commit(), []
    start = time.time()

    def add(impl, shape, metric, value):
        rows.append(dict(op="cublas_probe", impl=f"{impl}@{setting}", shape=shape, metric=metric,
                         median=float(value), device=name, commit=sha))

    def timed(fn) -> float:
        if dry:
            fn()
            t = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                t.append((time.perf_counter() - t0) * 1e3)
            return sorted(t)[1]
        from rlkit.bench.kernels import _graph_ms

        return _graph_ms(fn)

    def mm_fp32(x, w):  # x @ w.T with fp32 out from bf16 operands (one cuBLAS call; CPU: exact widening)
        return (x.float() @ w.float().t()) if dry else torch.mm(x, w.t(), out_dtype=torch.float32)

    def addmm_fp32(acc, x, w):  # acc + x @ w.T, the add in cuBLAS's epilogue (beta = 1, fp32 C)
        return (acc + x.float() @ w.float().t()) if dry else torch.addmm(acc, x, w.t(), out_dtype=torch.float32)

    def randn(*shape, scale=1.0, seed=0):
        g = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)

    if dry:
        shapes = {f"tiny.{n}": s for n, s in DRY_SHAPES.items()}
    else:
        from rlkit.bench.kernels import gemm_shapes

        shapes = {f"{m}.{n}": s for m in models for n, s in gemm_shapes(m).items()}
    big = max(ms)
    for label, (k, n, row_par) in shapes.items():
        if time.time() - start > budget_s:
            print(f"{setting}: budget of {budget_s:.0f} s spent; {label} and after not measured", flush=True)
            break
        w, x = randn(n, k, scale=0.02, seed=1), randn(big, k, seed=2)
        whole = F.linear(x, w)
        strict_whole = gemm.strict(x, w, contract, row_parallel=row_par)
        routes = {}  # the row-parallel layers' routes: name -> (fn, its whole-batch product)
        if row_par:
            bounds = gemm._chunk_bounds(k, gemm.chunk_count(contract, True), contract, True)  # the contract's

            def chunk_sum(xs, in_epilogue):
                """The chunks in order from chunk 0's fp32 product: each next one added by a separate add
                ("chunked") or as cuBLAS's C with beta = 1 ("chained": no add kernel); rounded once."""
                (lo, hi), rest = bounds[0], bounds[1:]
                acc = mm_fp32(xs[:, lo:hi], w[:, lo:hi])
                for lo, hi in rest:
                    acc = (addmm_fp32(acc, xs[:, lo:hi], w[:, lo:hi]) if in_epilogue
                           else acc + mm_fp32(xs[:, lo:hi], w[:, lo:hi]))
                return acc.to(torch.bfloat16)

            for name, in_epilogue in (("chunked", False), ("chained", True)):
                fn = lambda xs, e=in_epilogue: chunk_sum(xs, e)  # noqa: E731
                try:
                    routes[name] = (fn, fn(x))
                except Exception as exc:  # noqa: BLE001 - e.g. no fp32-out mm / addmm in this torch: a row says so
                    print(f"{setting}: {label}: the {name} route failed ({type(exc).__name__}: "
                          f"{str(exc)[:160]})", flush=True)
                    add(f"{name} failed: {type(exc).__name__}", label, "seen", 1.0)
        for m in ms:
            shape = f"{label} M={m} K={k} N={n}"
            xm = x[:m]
            y = F.linear(xm, w)
            for metric, (count, delta) in (("rows", bits_differ(y, whole[:m])),
                                           ("strict", bits_differ(y, strict_whole[:m]))):
                add("cublas", shape, f"{metric}_differing", count)
                add("cublas", shape, f"{metric}_max_abs_diff", delta)
            if not row_par:
                for t in (2, 4):
                    shard = n // t
                    first = bits_differ(F.linear(xm, w[:shard]), whole[:m, :shard])
                    last = bits_differ(F.linear(xm, w[n - shard:]), whole[:m, n - shard:])
                    add("cublas", shape, f"tp{t}_differing", first[0] + last[0])
            add("cublas", shape, "ms", timed(lambda: F.linear(xm, w)))
            add("strict", shape, "ms", timed(lambda: gemm.strict(xm, w, contract, row_parallel=row_par)))
            if not dry:
                add(f"cublas kernels: {kernel_names(lambda: F.linear(xm, w))}", shape, "seen", 1.0)
            for name, (fn, route_whole) in routes.items():
                yc = fn(xm)
                add(name, shape, "rows_differing", bits_differ(yc, route_whole[:m])[0])
                count, delta = bits_differ(yc, strict_whole[:m])
                add(name, shape, "strict_differing", count)
                add(name, shape, "strict_max_abs_diff", delta)
                add(name, shape, "ms", timed(lambda: fn(xm)))
            print(f"{setting}: {shape} " + " ".join(f"{r['metric']}={r['median']:.4g}" for r in rows[-6:]
                                                   if r["shape"] == shape and r["impl"].startswith("cublas@")),
                  flush=True)
        del w, x, whole, strict_whole, routes
    (out / f"cublas_probe-{setting}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def table(rows: list[dict]) -> str:
    """Per setting and implementation: shapes (of all measured) whose every bitwise check held, the
    largest counts, and the median time ratio against the default setting's cuBLAS."""
    by = {}
    for r in rows:
        by.setdefault((r["impl"].split("@")[-1], r["impl"].split("@")[0], r["shape"]), {})[r["metric"]] = r["median"]
    base = {shape: v["ms"] for (s, impl, shape), v in by.items() if s == "default" and impl == "cublas" and "ms" in v}
    lines = ["| setting | impl | invariant (rows and tp equal) / measured | equal to strict / measured "
             "| rows differing (max) | tp differing (max) | strict differing (max) | default cuBLAS time / this "
             "(median, range) |", "|---|---|---|---|---|---|---|---|"]
    for setting in SETTINGS:
        for impl in ("cublas", "chunked", "chained", "strict"):
            cells = {shape: v for (s, i, shape), v in by.items() if s == setting and i == impl}
            if not cells:
                continue
            worst = {m: max((v.get(k, 0) for v in cells.values() for k in v
                             if k.startswith(m) and k.endswith("_differing")), default=0)
                     for m in ("rows", "tp", "strict")}
            invariant = sum(1 for v in cells.values() if "rows_differing" in v and not any(
                v[k] for k in v if k.endswith("_differing") and not k.startswith("strict")))
            equal = sum(1 for v in cells.values() if v.get("strict_differing", 1) == 0)
            ratios = sorted(base[shape] / v["ms"] for shape, v in cells.items() if "ms" in v and shape in base)
            ratio = f"{ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})" if ratios else "-"
            checked = impl != "strict"
            lines.append(f"| {setting} | {impl} | {f'{invariant} / {len(cells)}' if checked else '-'} | "
                         f"{f'{equal} / {len(cells)}' if checked else '-'} | {worst['rows']:.0f} | "
                         f"{worst['tp']:.0f} | {worst['strict']:.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for cublas_probe.jsonl / .csv (created)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of model presets")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list from: {', '.join(SETTINGS)}")
    ap.add_argument("--budget-s", type=float, default=150.0, help="seconds each setting may measure for")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes: the script's logic only")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    models = [m for m in a.models.split(",") if m]
    ms = DRY_MS if a.dry else MS
    if a.child:
        child(a.child, out, models, ms, a.budget_s, a.dry)
        return 0
    settings = [s for s in a.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        print(f"cublas_probe: unknown setting(s) {unknown}; choose from {list(SETTINGS)}", file=sys.stderr)
        return 2
    rows = []
    for setting in settings:
        env = dict(os.environ, **SETTINGS[setting])
        cmd = [sys.executable, __file__, "--out", str(out), "--models", a.models, "--budget-s", str(a.budget_s),
               "--child", setting] + (["--dry"] if a.dry else [])
        rc = subprocess.run(cmd, env=env).returncode
        part = out / f"cublas_probe-{setting}.jsonl"
        if rc or not part.is_file():
            print(f"cublas_probe: setting {setting} ended with status {rc}; its rows are left out", file=sys.stderr)
            continue
        rows += [json.loads(line) for line in part.read_text().splitlines()]
    with open(out / "cublas_probe.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(out / "cublas_probe.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["op", "impl", "shape", "metric", "median", "device", "commit"])
        writer.writeheader()
        writer.writerows(rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
