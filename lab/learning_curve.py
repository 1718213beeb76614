"""Does the lab's default run learn? 50 strict steps of the arithmetic task on the CPU, reward per step.

Prints the mean reward of the first and the last 10 steps and every step's (reward, mismatch_count);
the numbers go in lab/LOG.md. Not a test: it takes ~5 minutes on 2 cores.

    .venv/bin/python lab/learning_curve.py [--steps 50] [--path strict] [--run-dir runs/curve]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

from rlkit.config import lab_default
from rlkit.loop import run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--path", default="strict", choices=["strict", "native"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    args = ap.parse_args()
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="rlkit-curve-")
    try:
        store = run(f"{run_dir}/run" if not args.run_dir else run_dir,
                    lab_default(steps=args.steps, path=args.path, seed=args.seed))
        steps = store.steps()
        rewards = [s.reward_mean for s in steps]
        k = min(10, len(rewards) // 2)
        print("step reward mismatch_count")
        for s in steps:
            print(f"{s.step:4d} {s.reward_mean:6.3f} {s.mismatch_count:5d}")
        print(f"mean reward, first {k} steps: {sum(rewards[:k]) / k:.4f}; last {k} steps: "
              f"{sum(rewards[-k:]) / k:.4f}; total mismatches: {sum(s.mismatch_count for s in steps)}")
    finally:
        if not args.run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
