"""A GPU model's measured GEMM launch table (kernels/gemm_tuned.py) from the rows lab/chained_gemm_h200.py wrote.

For every product the probe timed at M <= 64, the fastest launch it timed that gave the plan's bits is
compared with what rlkit's strict call runs without a table: cuBLAS where the route took the shape
(`on_cublas`), else the plan's Triton launch. It enters the table for the plan's M range holding that M
(gemm_tuned.ROW_RANGES) where it takes at most `margin` of that time; where the probe timed several M of
one range, the launch fastest at the largest of them, and only if it gains so at every one. Run on the
CPU, from committed rows:

    python -m rlkit.bench.gemm_tables --rows lab/bench/<run>/chained_gemm.jsonl --arch sm_90 --out kernels/tuned
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rlkit.bench.rows import RowsError, read_rows
from rlkit.kernels import gemm_tuned

MARGIN = 0.95
"""A launch enters the table only where it took at most this fraction of the strict call's time: a
smaller gain is within the run-to-run spread of a few-microsecond product (lab/LOG.md)."""

_SHAPE = re.compile(r"^(?P<layer>\S+) M=(?P<m>\d+) K=(?P<k>\d+) N=(?P<n>\d+)$")
BASELINE_IMPLS = ("cublas in-process", "triton plan")
"""The probe's timings of the cuBLAS route and of the plan's Triton launch."""


def _cells(rows: list[dict]) -> dict[str, dict]:
    """shape -> {"us": {impl: us}, "same": {impl: bool}, "launch": {impl: cfg}, "on_cublas": bool}."""
    cells: dict[str, dict] = {}
    for r in rows:
        if r.get("op") != "gemm_chained":
            continue
        c = cells.setdefault(r["shape"], {"us": {}, "same": {}, "launch": {}, "on_cublas": False})
        metric = r["metric"]
        if metric == "us":
            c["us"][r["impl"]] = float(r["median"])
        elif metric == "same_bits":
            c["same"][r["impl"]] = bool(r["median"])
        elif metric.startswith("launch:"):
            c["launch"][r["impl"]] = json.loads(metric.removeprefix("launch:"))
        elif metric == "on_cublas":
            c["on_cublas"] = bool(r["median"])
    return cells


def build(rows: list[dict], arch: str, margin: float = MARGIN) -> dict:
    """The table (gemm_tuned's file format) these rows justify; ValueError if they name no device or more
    than one, or a baseline is missing for a cell that has candidates."""
    devices = {r["device"] for r in rows if r.get("op") == "gemm_chained"}
    if len(devices) != 1:
        raise ValueError(f"the rows must come from one GPU model; they name {sorted(devices) or 'none'}")
    commits = sorted({r.get("commit", "unknown") for r in rows if r.get("op") == "gemm_chained"})
    ranges: dict[tuple, list] = {}  # (K, N, M range) -> [(M, {impl: us}, baseline us, {impl: launch})]
    for shape, c in _cells(rows).items():
        m = _SHAPE.match(shape)
        if m is None:
            continue
        rows_m, k, n = int(m["m"]), int(m["k"]), int(m["n"])
        span = gemm_tuned.row_range(rows_m)
        timed = {impl: us for impl, us in c["us"].items() if impl in c["launch"] and c["same"].get(impl)}
        if span is None or not timed:
            continue
        base_impl = BASELINE_IMPLS[0] if c["on_cublas"] else BASELINE_IMPLS[1]
        if base_impl not in c["us"]:
            raise ValueError(f"{shape}: no {base_impl!r} time to compare its launches with")
        ranges.setdefault((k, n, span), []).append((rows_m, timed, c["us"][base_impl], c["launch"]))
    entries = []
    for (k, n, span), cells in sorted(ranges.items()):
        _, top_timed, top_base, launches = max(cells, key=lambda cell: cell[0])
        best = min(top_timed, key=lambda impl: (top_timed[impl], impl))
        # the launch fastest at the range's largest M timed, kept if it gains at every M timed in the range
        if all(best in timed and timed[best] <= margin * base for _, timed, base, _ in cells):
            entries.append({"k": k, "n": n, "rows": list(span), "dtype": "bfloat16", "launch": launches[best],
                            "us": round(top_timed[best], 2), "route_us": round(top_base, 2)})
    return {"device": devices.pop(), "arch": arch, "measured": " ".join(commits), "entries": entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, nargs="+", required=True, help="chained_gemm.jsonl(.gz) files of one GPU model")
    ap.add_argument("--arch", default="sm_90", help="the GPU's arch as the compile check names it (sm_90)")
    ap.add_argument("--margin", type=float, default=MARGIN)
    ap.add_argument("--out", type=Path, required=True, help="folder to write <device>.json into (kernels/tuned)")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.rows)
    except RowsError as e:
        print(f"gemm_tables: {e}", file=sys.stderr)
        return 2
    try:
        table = build(rows, args.arch, args.margin)
    except ValueError as e:
        print(f"gemm_tables: {e}", file=sys.stderr)
        return 2
    write(table, args.out)
    return 0


def write(table: dict, folder: Path) -> Path:
    """Write `table` as folder/<device>.json, read it back as the launcher would, print its entries."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / gemm_tuned.file_name(table["device"])
    path.write_text(json.dumps(table, indent=1) + "\n")
    gemm_tuned.load(path)  # what was written is a table the launcher accepts
    print(f"launch table {path}: {len(table['entries'])} entries")
    for e in table["entries"]:
        print(f"  K={e['k']} N={e['n']} M={e['rows'][0]}-{e['rows'][1]}: {e['launch']} {e['us']} us "
              f"(strict without the table {e['route_us']} us)")
    return path


if __name__ == "__main__":
    raise SystemExit(main())
