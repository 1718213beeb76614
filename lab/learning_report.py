"""Issue 17's numbers from the learning arms' stores: a table by blocks of steps, the held-out rise, the criteria.

For each run folder (an arm exported by lab/learning_h200.py, or any run with held-out evaluations): one
markdown row per block of --block steps (train reward mean, held-out range, compared tokens, mismatches,
max |d|, median K3 KL, the ratio spread, clipped fraction, median grad norm, entropy estimate, response
length, median step seconds), then `rlkit.heldout.heldout_rise`'s summary, then issue 17's criteria for a
strict arm (at least 300 steps, 0 mismatching tokens at every step, at least 10 M compared in all, the
held-out rise above its evaluation-to-evaluation noise), each said met or not. With two or more runs, the
held-out rewards side by side at the steps every run evaluated.

    .venv/bin/python lab/learning_report.py lab/runs/h200-learning-*/strict lab/runs/h200-learning-*/native
Exit status 0; reading a folder that is not a run store is a one-line error (status 2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from learning_h200 import ARM_STEPS, COMPARED_TARGET  # lab/ is this script's folder
from rlkit.heldout import heldout_rise
from rlkit.timeline.store import RunStore, StoreError


def block_rows(steps, block: int) -> list[str]:
    rows = ["| steps | train reward (mean) | held-out reward | compared tokens | mismatches | max \\|d\\| | K3 KL "
            "(median) | ratio spread | clipped | grad norm (median) | entropy estimate | response tokens | "
            "step s (median) |",
            "|" + "---|" * 13]
    for lo in range(0, len(steps), block):
        part = steps[lo:lo + block]
        held = [s.heldout_reward for s in part if s.heldout_reward is not None]
        grads = [s.grad_norm for s in part if s.grad_norm is not None]
        ents = [s.entropy_estimate for s in part if s.entropy_estimate is not None]
        lens = [s.response_tokens_mean for s in part if s.response_tokens_mean is not None]
        rows.append(
            f"| {part[0].step}-{part[-1].step} | {statistics.fmean(s.reward_mean for s in part):.3f} | "
            + (f"{min(held):.3f}-{max(held):.3f}" if held else "-")
            + f" | {sum(s.compared_tokens for s in part):,} | {sum(s.mismatch_count for s in part):,} | "
            f"{max(s.max_abs_diff for s in part):.3g} | {statistics.median(s.k3_kl for s in part):.3g} | "
            f"[{min(s.ratio_min for s in part):.4f}, {max(s.ratio_max for s in part):.4f}] | "
            f"{statistics.fmean(s.clip_fraction for s in part):.4f} | "
            + (f"{statistics.median(grads):.3g}" if grads else "-") + " | "
            + (f"{statistics.fmean(ents):.4f}" if ents else "-") + " | "
            + (f"{statistics.fmean(lens):.1f}" if lens else "-")
            + f" | {statistics.median(s.timings.get('step_s', 0.0) for s in part):.2f} |")
    return rows


def criteria(steps, rise) -> list[tuple[str, bool]]:
    compared = sum(s.compared_tokens for s in steps)
    bad = [s.step for s in steps if s.mismatch_count]
    return [
        (f"{len(steps)} steps (at least {ARM_STEPS})", len(steps) >= ARM_STEPS),
        (f"mismatching tokens at {len(bad)} steps" + (f" (first: {bad[:5]})" if bad else ""), not bad),
        (f"{compared:,} compared tokens (at least {COMPARED_TARGET:,})", compared >= COMPARED_TARGET),
        ("held-out rise " + (f"{rise.rise:+.3f} against noise {rise.noise:.3f}" if rise else "not measurable"),
         bool(rise) and rise.rise > rise.noise > 0),
    ]


def report(run_dir: Path, block: int, tail: int) -> tuple[str, dict[int, float]]:
    with RunStore.open(run_dir, readonly=True) as store:
        steps, cfg = store.steps(), store.config()
    name = f"{run_dir} ({cfg.get('path', '?')}, {cfg.get('model', '?')}, {len(steps)} of {cfg.get('steps')} steps)"
    lines = [f"## {name}", ""]
    if not steps:
        return "\n".join(lines + ["no steps stored", ""]), {}
    lines += block_rows(steps, block) + [""]
    try:
        rise = heldout_rise(steps, tail=tail, n_prompts=cfg.get("heldout_prompts"))
        lines.append(rise.summary())
    except ValueError as e:
        rise = None
        lines.append(f"held-out rise: {e}")
    lines += ["", "Issue 17's criteria for a strict arm:"]
    lines += [f"- {'met' if ok else 'NOT met'}: {what}" for what, ok in criteria(steps, rise)]
    return "\n".join(lines + [""]), {s.step: s.heldout_reward for s in steps if s.heldout_reward is not None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (an arm's exported store)")
    ap.add_argument("--block", type=int, default=50, help="steps a table row")
    ap.add_argument("--tail", type=int, default=5, help="the held-out evaluations averaged as the end value")
    args = ap.parse_args()
    if args.block < 1:
        ap.error("--block must be at least 1")
    curves = {}
    for run_dir in args.runs:
        try:
            text, curves[run_dir] = report(run_dir, args.block, args.tail)
        except StoreError as e:
            print(f"learning_report: {e}", file=sys.stderr)
            return 2
        print(text)
    if len(curves) > 1:
        shared = sorted(set.intersection(*(set(c) for c in curves.values())))
        print("## held-out reward side by side\n")
        print("| step | " + " | ".join(str(r) for r in curves) + " |")
        print("|---|" + "---|" * len(curves))
        for step in shared:
            print(f"| {step} | " + " | ".join(f"{c[step]:.3f}" for c in curves.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
