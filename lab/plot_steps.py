"""Per-step charts of run stores, overlaid, as a PNG for the docs: the dashboard's own figure
(rlkit.dashboards.export), drawn by Plotly.js in headless Chromium.

    .venv/bin/python lab/plot_steps.py lab/runs/h200-validation-2026-11-29/{strict,native} \\
        --metrics mismatch_count,max_abs_diff,k3_kl,reward_mean --out docs/img/validation-steps.png
"""

from __future__ import annotations

import argparse
import sys

from rlkit.dashboards.export import step_charts_png
from rlkit.dashboards.state import METRICS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories (one colour each, in this order)")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--metrics", default=",".join(METRICS), help=f"comma list from: {', '.join(METRICS)}")
    ap.add_argument("--width", type=int, default=1000, help="CSS pixels")
    a = ap.parse_args()
    try:
        out = step_charts_png(a.runs, a.out, [m for m in a.metrics.split(",") if m], a.width)
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"plot_steps: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
