"""The learning runs on one H200: a warm-started qwen3-0.6b-shaped policy, then strict and native RL arms
from the same checkpoint (issue 17's "does exactness change learning?").

The task is "add9c" (rlkit/data/arith.py): nine-digit addition worked column by column from the labelled
column pairs of the prompt, 153-162 tokens a response (~157 on average), so 256 samples a step compare ~40 k
response tokens and 300 steps ~12 M, past issue 17's 10 M for the strict arm; the reward reads the sum the
working writes. (The first task, add8w, asked the model to find each column's digits in "a+b" by position;
a 151-step probe on the H200 learnt the working's form but not the digits: reward 0.000.)

Phases (one per device call, each within the call's 10 minutes):
- `warmstart --ckpt DIR [--init-from PREV] [--minutes M]`: the supervised phase (rlkit.warmstart.warmstart_0_6b:
  seeded init, add9c trained on the whole working, 64-problem batches, held-out reward every 20 steps)
  until the held-out reward lies in 0.2-0.6 or M minutes pass; writes the init checkpoint to DIR (DIR must
  be new). When the budget ends it below the band, run it again with `--init-from DIR --ckpt DIR2` (the
  weights continue; AdamW restarts).
- `arm --path strict|native --ckpt DIR --steps N --minutes M`: the RL arm (rlkit.config.learning_0_6b:
  16 prompts x 16 samples, up to 192 new tokens each) started from DIR's weights, or continued from its
  last checkpoint when its run folder exists under --work (rlkit's resume: the loop checkpoints at the step
  a stop request ends on, so an arm spans device calls). Stops cleanly once M minutes have passed (the
  current step completes and is checkpointed), then prints every new step (train reward, held-out reward,
  K3 KL, mismatch_count / compared tokens and the arm's compared tokens so far against the 10 M target,
  max_abs_diff, ratio spread, clipped fraction, grad norm, response length, the sampled tokens' mean -log p
  as entropy estimate) and exports the store to --out/learning-PATH/ (per-token data of every k-th step, k
  chosen to fit the device channel's 16 MiB a file).

On the lent H200 (rlkit installed editable first, offline; the data travel in an ignored folder):
    RLKIT_DATA=.device_data python3 lab/learning_h200.py warmstart --ckpt /tmp/learn/warm --minutes 8
    RLKIT_DATA=.device_data python3 lab/learning_h200.py arm --path strict --ckpt /tmp/learn/warm --minutes 8 --out $OUT
Two arms side by side on one GPU (each process starts its own local Ray instance; give each its own --work):
    python3 lab/learning_h200.py arm --path strict --micro-batch-tokens 16384 --work /tmp/learn/s ... &
    python3 lab/learning_h200.py arm --path native --micro-batch-tokens 16384 --work /tmp/learn/n ... & wait
--dry-run runs the same phases on the CPU with the tiny preset and a few small steps of the same task (2 x 2
samples, responses up to the task's 192 tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from rlkit.config import learning_0_6b
from rlkit.timeline.store import DB_NAME, RunStore
from rlkit.warmstart import supervised_phase, warmstart_0_6b
from validate_h200 import export, timed_run  # lab/ is this script's folder: the validation's helpers

DRY_WARMSTART = dict(model="tiny", device="cpu", dtype="float32", batch_size=4, max_steps=3, eval_every=1,
                     eval_prompts=4, threads=1)
DRY_ARM = dict(model="tiny", device="cpu", dtype="float32", prompts_per_step=2, samples_per_prompt=2,
               heldout_every=2, heldout_prompts=4, checkpoint_every=2, threads=1)


def warmstart_phase(args) -> int:
    overrides = {"max_minutes": args.minutes, "init_from": args.init_from or ""}
    if args.max_steps:  # a rebuild of a known phase: evaluate at its end only (training is the same)
        overrides.update(max_steps=args.max_steps, eval_every=args.max_steps)
    cfg = warmstart_0_6b(**{**(DRY_WARMSTART if args.dry_run else {}), **overrides})

    def show(row: dict) -> None:
        print(f"warmstart step {row['step']:5d} loss {row['loss'] if row['loss'] is None else round(row['loss'], 4)} "
              f"held-out reward {row['reward']:.3f} ({row['n']} prompts, {row['response_tokens_mean']:.2f} tokens) "
              f"{row['elapsed_s']:.0f} s", flush=True)

    manifest = supervised_phase(cfg, args.ckpt, progress=False, log=show)
    made = manifest["made_by"]
    print(json.dumps({"ckpt": str(args.ckpt), "weights_checksum": manifest["weights_checksum"],
                      "steps": made["steps"], "stopped_because": made["stopped_because"],
                      "heldout_reward": made["heldout"]["reward"], "in_band": made["in_band"]}), flush=True)
    return 0


COMPARED_TARGET = 10_000_000
"""Issue 17: the strict arm compares at least this many response tokens in all."""
ARM_STEPS = 300
"""Issue 17: each arm runs at least this many steps."""


def print_steps(path: str, steps, compared_before: int = 0) -> None:
    """One line per step; `compared_before`: the arm's compared tokens in the steps before these."""
    compared = compared_before
    for s in steps:
        compared += s.compared_tokens
        held = "      -" if s.heldout_reward is None else f"{s.heldout_reward:7.3f}"
        grad = "-" if s.grad_norm is None else f"{s.grad_norm:.3g}"
        length = "-" if s.response_tokens_mean is None else f"{s.response_tokens_mean:.2f}"
        entropy = "-" if s.entropy_estimate is None else f"{s.entropy_estimate:.3f}"
        print(f"{path:6} step {s.step:4d} reward {s.reward_mean:.3f} held-out {held} k3_kl {s.k3_kl:.3e} "
              f"mismatch {s.mismatch_count:5d}/{s.compared_tokens:<5d} max|d| {s.max_abs_diff:.3g} "
              f"ratio [{s.ratio_min:.4f}, {s.ratio_max:.4f}] clipped {s.clip_fraction:.4f} grad {grad} "
              f"len {length} entropy~ {entropy} compared so far {compared / 1e6:.3f} M of "
              f"{COMPARED_TARGET / 1e6:.0f} M step {s.timings['step_s']:.2f}s (rollout "
              f"{s.timings.get('rollout_s', 0):.2f} train {s.timings.get('train_s', 0):.2f} sync "
              f"{s.timings.get('sync_s', 0):.2f} held-out {s.timings.get('heldout_s', 0):.2f})", flush=True)


def arm_phase(args) -> int:
    run_dir = Path(args.work) / f"arm-{args.path}"
    cfg = learning_0_6b(path=args.path, steps=args.steps, init_checkpoint=str(args.ckpt), runner=args.runner,
                        **(DRY_ARM if args.dry_run else {}))
    if args.micro_batch_tokens:
        cfg = cfg.replace(optim=dataclasses.replace(cfg.optim, max_batch_tokens=args.micro_batch_tokens,
                                                    micro_batch_tokens=args.micro_batch_tokens))
    before, wall = 0, 0.0
    if (run_dir / DB_NAME).exists():
        with RunStore.open(run_dir, readonly=True) as s:
            before, planned = len(s.steps()), s.config()["steps"]
        if before >= planned:
            print(f"{args.path}: all {planned} steps are in {run_dir} already; nothing to run", flush=True)
    if not (run_dir / DB_NAME).exists() or before < planned:
        wall = timed_run(run_dir, cfg, args.minutes)
    with RunStore.open(run_dir, readonly=True) as store:
        steps = store.steps()
        print_steps(args.path, steps[before:], sum(s.compared_tokens for s in steps[:before]))
        init = store.info("init_checkpoint") or {}
        compared = sum(s.compared_tokens for s in steps)
        print(f"{args.path}: {len(steps) - before} steps in {wall:.0f} s this call, {len(steps)} of {args.steps} in "
              f"all; started from {init.get('path')} (weights checksum {init.get('weights_checksum')}, version 0 "
              f"{store.versions()[0].checksum}); mismatches so far {sum(s.mismatch_count for s in steps)} of "
              f"{compared} compared tokens ({compared / COMPARED_TARGET:.1%} of {COMPARED_TARGET:,})", flush=True)
        if args.out:
            exported, every = export(store, Path(args.out) / f"learning-{args.path}")
            print(f"{args.path}: exported {exported} ({exported.stat().st_size / 2**20:.1f} MiB, per-token data of "
                  f"every {every} step(s))", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    w = sub.add_parser("warmstart", help="the supervised phase; writes the init checkpoint")
    w.add_argument("--ckpt", required=True, help="a new folder for the init checkpoint")
    w.add_argument("--init-from", help="continue an earlier warm start's checkpoint")
    w.add_argument("--minutes", type=float, default=8.0)
    w.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many steps (0: the preset's), evaluating only before and after them; a "
                        "rerun with the steps an earlier phase took must give its weights checksum (the phase "
                        "trains under deterministic algorithms)")
    a = sub.add_parser("arm", help="one RL arm from the init checkpoint (created or resumed)")
    a.add_argument("--path", required=True, choices=["strict", "native"])
    a.add_argument("--ckpt", required=True, help="the init checkpoint (warmstart --ckpt)")
    a.add_argument("--steps", type=int, default=ARM_STEPS)
    a.add_argument("--minutes", type=float, default=8.0)
    a.add_argument("--work", default="/tmp/rlkit-learning", help="where the arms' run folders live")
    a.add_argument("--out", help="export the arm's store under this folder")
    a.add_argument("--runner", choices=["local", "ray"], default="local",
                   help="ray: the trainer and the rollout engine as Ray actors sharing the GPU (issue 17); "
                        "Ray must be importable (lab/device_carry.py)")
    a.add_argument("--micro-batch-tokens", type=int, default=0,
                   help="the trainer's micro-batch (and packed forward) in tokens instead of the preset's 32,768: "
                        "16,384 halves the trainer's activation peak (65 / 76 GiB strict / native at 32,768), so "
                        "two arms fit one H200 side by side; it changes the update's bits (another order of "
                        "gradient additions), so both arms of a comparison take the same value")
    for p in (w, a):
        p.add_argument("--dry-run", action="store_true", help="the same phase on the CPU with the tiny preset")
    args = ap.parse_args()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"device {device}, torch {torch.__version__}, phase {args.phase}", flush=True)
    return warmstart_phase(args) if args.phase == "warmstart" else arm_phase(args)


if __name__ == "__main__":
    sys.exit(main())
