"""The whole GPU suite at one commit inside one device call: its tests dealt round-robin to N pytest
processes on the same GPU (compiling the Triton kernels is CPU work, and the device has 16 cores; one
process took > 600 s, a call's limit). No test here times anything, so sharing the GPU moves no result.

    python3 lab/gpu_tests_parallel.py [--workers 4] [--out $W/gputests] [-- PYTEST_ARGS...]

Writes OUT/worker-<i>.log (pytest -rA -s: every bitwise report) and prints each worker's summary line and
every failing test id; exits non-zero when a worker failed or collected nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collect(paths: list[str], extra: list[str]) -> list[str]:
    """Test ids pytest would run (one line each under --collect-only -q)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *paths, *extra],
                         cwd=ROOT, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        print(out.stdout[-2000:], out.stderr[-2000:], sep="\n")
    return ids


def deal(ids: list[str], workers: int) -> list[list[str]]:
    """Round-robin, so the parametrized cases of one heavy test spread over every worker."""
    return [ids[i::workers] for i in range(workers) if ids[i::workers]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", default="gputests")
    ap.add_argument("--paths", default="tests/gpu")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = collect(a.paths.split(","), a.pytest_args)
    if not ids:
        print("collected no tests")
        return 2
    groups = deal(ids, a.workers)
    print(f"{len(ids)} tests over {len(groups)} workers", flush=True)
    t0 = time.time()
    procs = []
    for i, group in enumerate(groups):
        (out / f"worker-{i}.ids").write_text("\n".join(group) + "\n")
        log = open(out / f"worker-{i}.log", "w")
        procs.append((subprocess.Popen([sys.executable, "-m", "pytest", "-rA", "-s", "-p", "no:cacheprovider",
                                        *a.pytest_args, *group], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT),
                      log))
    bad = 0
    for i, (proc, log) in enumerate(procs):
        rc = proc.wait()
        log.close()
        text = (out / f"worker-{i}.log").read_text(errors="replace").splitlines()
        summary = next((line for line in reversed(text) if " in " in line and ("passed" in line or "failed" in line)),
                       "(no summary line)")
        print(f"worker {i}: rc={rc} {summary.strip('= ')}", flush=True)
        for line in text:
            if line.startswith(("FAILED", "ERROR")):
                print("  " + line)
        bad += rc != 0
    print(f"all workers done in {time.time() - t0:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
