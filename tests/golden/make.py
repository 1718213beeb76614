"""The golden run: a short strict CPU run of the tiny preset, recorded per step, compared bit for bit.

What: `GOLDEN_CONFIG` (the lab preset shortened: tiny Qwen3 in bf16, single-digit addition, every op
strict, no warm start, 3 steps of 2 prompts x 4 samples, the ASCII shaping term so the weights move at
every step, one thread). Each step's row: loss, reward mean, compared tokens, mismatch_count,
max_abs_diff (floats as `float.hex`, so the file holds their exact bits), the checksum of the weights the
update produced, and a SHA-256 of every record's id, tokens and recorded logprobs (fp32 bytes).
tests/golden/test_golden.py reruns it and compares every field exactly.

The run always happens in a child process started with rlkit.hardware.REPRODUCIBLE_CPU_ENV (MKL's
vendor-independent branch, ATen and oneDNN capped at AVX2): without it the bits depend on the CPU's
instruction set (measured: an Intel AVX-512 CPU and the same CPU capped at AVX2 differ from step 0).
The file records the libraries the bits came from (`platform`: torch, MKL, oneDNN, ATen's ISA).

Regenerate (after a change that moves a bit on purpose; say why in lab/LOG.md):

    .venv/bin/python -m tests.golden.make            # rewrites tests/golden/tiny_strict_run.json

About 20 s on one idle core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from rlkit.config import RunConfig, lab_default
from rlkit.hardware import REPRODUCIBLE_CPU_ENV, child_env, cpu_platform

GOLDEN_FILE = Path(__file__).with_name("tiny_strict_run.json")
GOLDEN_CONFIG: RunConfig = lab_default(steps=3, warm_start_steps=0, prompts_per_step=2, samples_per_prompt=4,
                                       path="strict", shaping=0.1, locate_every=0, checkpoint_every=0,
                                       seed=7, threads=1, dtype="float32")
ROOT = Path(__file__).resolve().parents[2]


def _hex(x: float) -> str:
    return float(x).hex()


def records_digest(records) -> str:
    """SHA-256 over each record's id, token ids (int32) and recorded logprobs (fp32 bytes), in order."""
    h = hashlib.sha256()
    for r in records:
        h.update(r.record_id.encode() + b"\0")
        h.update(struct.pack(f"<{len(r.token_ids)}i", *r.token_ids))
        h.update(struct.pack(f"<{len(r.rollout_logprobs)}f", *r.rollout_logprobs))
    return h.hexdigest()


def golden_run(run_dir: Path) -> dict:
    """Run GOLDEN_CONFIG into `run_dir` (a new folder) in this process and return its golden record."""
    import torch

    from rlkit.loop import run

    threads = torch.get_num_threads()
    try:
        store = run(run_dir, GOLDEN_CONFIG, progress=False)
    finally:
        torch.set_num_threads(threads)  # the config's thread count is the run's, not the caller's
    with store:
        checksums = {v.version: v.checksum for v in store.versions()}
        rows = [{"step": s.step, "loss": _hex(s.loss), "reward_mean": _hex(s.reward_mean),
                 "compared_tokens": s.compared_tokens, "mismatch_count": s.mismatch_count,
                 "max_abs_diff": _hex(s.max_abs_diff), "weight_checksum": checksums[s.weight_version + 1],
                 "records_sha256": records_digest(store.records(s.step))}
                for s in store.steps()]
    return {"platform": cpu_platform(), "config": GOLDEN_CONFIG.to_dict(),
            "initial_weight_checksum": checksums[0], "rows": rows}


def generate(work_dir: Path) -> dict:
    """The golden record of a fresh run, made in a child process with REPRODUCIBLE_CPU_ENV."""
    work_dir.mkdir(parents=True, exist_ok=True)
    out = work_dir / "golden.json"
    res = subprocess.run([sys.executable, "-m", "tests.golden.make", "--in-this-process", "--out", str(out),
                          "--run-dir", str(work_dir / "run")], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=600)
    if res.returncode:
        raise RuntimeError(f"the golden run failed (exit {res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=GOLDEN_FILE, help=f"where to write (default {GOLDEN_FILE})")
    ap.add_argument("--in-this-process", action="store_true",
                    help="run here (the child generate() starts; needs REPRODUCIBLE_CPU_ENV already set)")
    ap.add_argument("--run-dir", type=Path, help="with --in-this-process: the run store's folder")
    args = ap.parse_args(argv)
    if args.in_this_process:
        wrong = {k: os.environ.get(k) for k, v in REPRODUCIBLE_CPU_ENV.items() if os.environ.get(k) != v}
        if wrong:
            ap.error(f"--in-this-process needs {dict(REPRODUCIBLE_CPU_ENV)} in the environment; have {wrong}")
        golden = golden_run(args.run_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            golden = generate(Path(tmp))
    args.out.write_text(json.dumps(golden, indent=1) + "\n")
    for row in golden["rows"]:
        print(row, file=sys.stderr)
    print(f"wrote {args.out} ({golden['platform']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
