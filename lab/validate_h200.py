"""Validation on one H200: strict RL steps of the qwen3-0.6b shape on DAPO-Math-17k, the native path alongside.

What it runs (rlkit.config.validation_0_6b: random init, seed 1234, 8 prompts x 8 samples per step,
512-token responses, strict path): the RL loop for `--strict-minutes`, then the same config on the
native path for `--native-minutes` (each stops at a step boundary once its time is up; the store then
holds only complete steps). Per step the store has compared tokens, mismatch_count, max_abs_diff,
importance-ratio spread, step time and its parts; the script prints one line per step and a summary
(totals, tokens/s, the strict/native step-time ratio) and copies both run stores to --out, where
`rlkit dashboard` opens them.

On the lent H200 (no rlkit install there; the data and wheels travel in ignored folders):
    PYTHONPATH=. RLKIT_DATA=.device_data python3 lab/validate_h200.py --out $OUT \
        --strict-minutes 4.5 --native-minutes 2
A machine session of this workplace has 30 device minutes: see docs/VALIDATION.md for what fitted.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.gpu.bootstrap import ensure_rlkit_kernels  # noqa: E402

ensure_rlkit_kernels()

import torch  # noqa: E402

from rlkit.config import validation_0_6b  # noqa: E402
from rlkit.loop import run  # noqa: E402


def timed_run(run_dir: Path, cfg, minutes: float):
    stop = threading.Event()
    timer = threading.Timer(minutes * 60, stop.set)
    timer.start()
    t0 = time.time()
    try:
        store = run(run_dir, cfg, progress=False, stop=stop)
    finally:
        timer.cancel()
    steps = store.steps()
    store.close()  # folds the WAL into run.sqlite before it is copied
    for s in steps:
        t = s.timings
        print(f"{cfg.path:6} step {s.step:3d} v{s.weight_version:<3d} tokens {s.compared_tokens:6d} "
              f"mismatch {s.mismatch_count:6d} max|d| {s.max_abs_diff:9.3g} ratio [{s.ratio_min:.4f}, "
              f"{s.ratio_max:.4f}] out {s.ratio_outside:.4f} step {t['step_s']:6.1f}s (rollout "
              f"{t['rollout_s']:.1f} train {t['train_s']:.1f} sync {t['sync_s']:.1f}) "
              f"{s.compared_tokens / t['step_s']:8.0f} tok/s", flush=True)
    return steps, time.time() - t0


def summary(path: str, steps) -> dict:
    n = len(steps)
    tokens = sum(s.compared_tokens for s in steps)
    step_s = [s.timings["step_s"] for s in steps]
    return {"path": path, "steps": n, "compared_tokens": tokens,
            "mismatch_count": sum(s.mismatch_count for s in steps),
            "steps_with_mismatch": sum(1 for s in steps if s.mismatch_count),
            "max_abs_diff": max((s.max_abs_diff for s in steps), default=0.0),
            "token_agreement": 1 - sum(s.mismatch_count for s in steps) / max(tokens, 1),
            "median_step_s": sorted(step_s)[n // 2] if n else 0.0,
            "median_rollout_s": sorted(s.timings["rollout_s"] for s in steps)[n // 2] if n else 0.0,
            "median_train_s": sorted(s.timings["train_s"] for s in steps)[n // 2] if n else 0.0,
            "tokens_per_s": tokens / max(sum(step_s), 1e-9)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/rlkit-validation")
    ap.add_argument("--strict-minutes", type=float, default=4.5)
    ap.add_argument("--native-minutes", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dry-run", action="store_true",
                    help="the same pipeline on the CPU with the tiny preset and 64-token responses")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"device {device}, torch {torch.__version__}", flush=True)
    results = []
    for path, minutes in (("strict", args.strict_minutes), ("native", args.native_minutes)):
        if minutes <= 0:
            continue
        cfg = validation_0_6b(path=path, steps=args.steps)
        if args.dry_run:
            cfg = cfg.replace(preset="tiny", device="cpu", max_tokens=16, prompts_per_step=2, threads=1)
        steps, wall = timed_run(work / path, cfg, minutes)
        results.append(summary(path, steps))
        shutil.copy(work / path / "run.sqlite", out / f"validation-{path}.sqlite")
        gc.collect()
        torch.cuda.empty_cache()
    if len(results) == 2 and results[1]["median_step_s"]:
        ratio = results[0]["median_step_s"] / results[1]["median_step_s"]
        results.append({"strict_over_native_step_time": ratio})
    (out / "validation-summary.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
