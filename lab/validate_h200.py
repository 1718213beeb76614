"""Validation on one H200: strict RL steps of the qwen3-0.6b shape on DAPO-Math-17k, the native path alongside.

What it runs (rlkit.config.validation_0_6b: random init, seed 1234, 2 prompts x 8 samples a step,
512-token responses, decode from CUDA graphs, an ASCII-share shaping reward so the weights move): for each
phase `PATH=MINUTES` of --phases, the RL loop on that path until its minutes are up or its 200 steps are
done. A phase whose run folder already exists under --work continues it (`rlkit run --resume`: the loop
saves a checkpoint at the step a stop request ends on), so 200 steps can span several device calls while
the machine stays warm. Per step the store has compared tokens, mismatch_count, max_abs_diff,
importance-ratio spread, step time and its parts. After each phase the run is exported to
--out/validation-PATH/ (every step summary; per-token data of every k-th step, k chosen so the file
comes back through the device channel's 16 MiB limit), where `rlkit dashboard` opens it, and a summary
of every step so far is printed and written to --out/validation-summary.json.

On the lent H200 (rlkit installed editable first, offline; the data travel in an ignored folder):
    python3 -m pip install -q --no-deps --no-build-isolation -e .
    RLKIT_DATA=.device_data python3 lab/validate_h200.py --out $OUT --phases strict=8.5
    RLKIT_DATA=.device_data python3 lab/validate_h200.py --out $OUT --phases strict=6,native=2
--dry-run runs the same pipeline on the CPU with the tiny preset and 16-token responses.
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

import torch

from rlkit.config import validation_0_6b
from rlkit.loop import run
from rlkit.timeline.store import DB_NAME, RunStore

EXPORT_LIMIT = 15 * 2**20


def phases(text: str) -> list[tuple[str, float]]:
    out = []
    for part in text.split(","):
        path, _, minutes = part.partition("=")
        if path not in ("strict", "native") or not minutes:
            raise SystemExit(f"--phases: {part!r}; expected PATH=MINUTES with PATH strict or native")
        out.append((path, float(minutes)))
    return out


def timed_run(run_dir: Path, cfg, minutes: float) -> float:
    stop = threading.Event()
    timer = threading.Timer(minutes * 60, stop.set)
    timer.start()
    t0 = time.time()
    resume = (run_dir / DB_NAME).exists()
    try:
        store = run(run_dir, None if resume else cfg, resume=resume, progress=False, stop=stop)
        store.close()  # folds the WAL into run.sqlite
    finally:
        timer.cancel()
    return time.time() - t0


def print_steps(path: str, steps) -> None:
    for s in steps:
        t = s.timings
        print(f"{path:6} step {s.step:3d} v{s.weight_version:<3d} tokens {s.compared_tokens:6d} "
              f"mismatch {s.mismatch_count:6d} max|d| {s.max_abs_diff:9.3g} ratio [{s.ratio_min:.4f}, "
              f"{s.ratio_max:.4f}] reward {s.reward_mean:.4f} step {t['step_s']:5.2f}s (rollout "
              f"{t['rollout_s']:.2f} train {t['train_s']:.2f} sync {t['sync_s']:.2f}) "
              f"{s.compared_tokens / t['step_s']:7.0f} tok/s", flush=True)


def summary(path: str, store: RunStore) -> dict:
    steps = store.steps()
    n = len(steps)
    tokens = sum(s.compared_tokens for s in steps)
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
    checksums = {v.checksum for v in store.versions()}
    return {"path": path, "steps": n, "compared_tokens": tokens,
            "mismatch_count": sum(s.mismatch_count for s in steps),
            "steps_with_mismatch": sum(1 for s in steps if s.mismatch_count),
            "max_abs_diff": max((s.max_abs_diff for s in steps), default=0.0),
            "token_agreement": 1 - sum(s.mismatch_count for s in steps) / max(tokens, 1),
            "ratio_min": min((s.ratio_min for s in steps), default=1.0),
            "ratio_max": max((s.ratio_max for s in steps), default=1.0),
            "distinct_weight_checksums": len(checksums), "versions": len(store.versions()),
            "median_step_s": med([s.timings["step_s"] for s in steps]),
            "median_rollout_s": med([s.timings["rollout_s"] for s in steps]),
            "median_train_s": med([s.timings["train_s"] for s in steps]),
            "median_sync_s": med([s.timings["sync_s"] for s in steps]),
            "tokens_per_s": tokens / max(sum(s.timings["step_s"] for s in steps), 1e-9)}


def export(store: RunStore, dst: Path) -> tuple[Path, int]:
    """The run with per-token data of every k-th step, the smallest k whose file fits EXPORT_LIMIT."""
    every = 1
    while True:
        shutil.rmtree(dst, ignore_errors=True)
        path = store.export(dst, token_steps_every=every)
        if path.stat().st_size <= EXPORT_LIMIT:
            return path, every
        every *= 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/rlkit-validation")
    ap.add_argument("--phases", type=phases, default=phases("strict=8.5"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--fresh", action="store_true", help="delete --work first (else phases continue)")
    ap.add_argument("--dry-run", action="store_true",
                    help="the same pipeline on the CPU with the tiny preset and 16-token responses")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"device {device}, torch {torch.__version__}", flush=True)
    for path, minutes in args.phases:
        cfg = validation_0_6b(path=path, steps=args.steps)
        if args.dry_run:
            cfg = cfg.replace(model="tiny", device="cpu", max_tokens=16, threads=1)
        before = 0
        if (work / path / DB_NAME).exists():
            with RunStore.open(work / path, readonly=True) as s:
                before = len(s.steps())
        wall = timed_run(work / path, cfg, minutes)
        with RunStore.open(work / path, readonly=True) as store:
            print_steps(path, store.steps()[before:])
            print(f"{path}: {len(store.steps()) - before} steps in {wall:.0f} s this call", flush=True)
            exported, every = export(store, out / f"validation-{path}")
            print(f"{path}: exported {exported} ({exported.stat().st_size / 2**20:.1f} MiB, per-token data of "
                  f"every {every} step(s))", flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    results = []
    for path in ("strict", "native"):
        if (work / path / DB_NAME).exists():
            with RunStore.open(work / path, readonly=True) as store:
                results.append(summary(path, store))
    if len(results) == 2 and results[1]["median_step_s"]:
        results.append({"strict_over_native_step_time": results[0]["median_step_s"] / results[1]["median_step_s"],
                        "strict_over_native_rollout_time":
                            results[0]["median_rollout_s"] / max(results[1]["median_rollout_s"], 1e-9),
                        "strict_over_native_train_time":
                            results[0]["median_train_s"] / max(results[1]["median_train_s"], 1e-9)})
    (out / "validation-summary.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
