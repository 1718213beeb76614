"""CPU benchmark of the two things a newcomer runs first (a benchmark, not a test: it measures, never judges).

- `rlkit lab` from its start to the first RL step of both runs (the warm start included), on its defaults;
- `rlkit run --steps 5` end to end on its defaults (tiny Qwen3, arithmetic, the lab preset's warm start).

Each run appends long-format rows (benchmark, metric, value, unit, cpu, dtype, torch, commit, date) to
lab/bench/cpu-runs.jsonl and re-renders lab/bench/CPU_RUNS.md from every row there, so the table shows each
CPU the benchmark was run on.

    .venv/bin/python lab/bench_cpu_runs.py                 # both, once
    .venv/bin/python lab/bench_cpu_runs.py --only run      # just `rlkit run --steps 5`
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rlkit import hardware
from rlkit.bench.provenance import commit
from rlkit.timeline.store import RunStore

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "lab" / "bench" / "cpu-runs.jsonl"
TABLE = REPO / "lab" / "bench" / "CPU_RUNS.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_run(work: Path) -> dict[str, float]:
    """`rlkit run --steps 5` on its defaults: wall time, and how it splits into before-step-0 and steps."""
    run_dir = work / "run"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "rlkit", "run", "--run-dir", str(run_dir), "--steps", "5", "--no-progress"],
                   check=True, cwd=REPO)
    wall = time.monotonic() - t0
    with RunStore.open(run_dir, readonly=True) as store:
        steps = [s.timings["step_s"] for s in store.steps()]
        dtype = store.config()["dtype"]
    return {"wall_s": wall, "steps_s": sum(steps), "before_first_step_s": wall - sum(steps),
            "median_step_s": sorted(steps)[len(steps) // 2], "dtype": dtype}


def bench_lab(work: Path) -> dict[str, float]:
    """`rlkit lab` on its defaults until both runs have committed a step, then Ctrl-C."""
    port = _free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlkit", "lab", "--runs-dir", str(work / "runs"), "--port",
                             str(port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    first = None
    try:
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as r:
                    runs = json.loads(r.read())["runs"]
                if runs and all(run.get("steps", 0) >= 1 for run in runs):
                    first = time.monotonic() - t0
                    dtype = runs[0]["platform"]["dtype"]
                    break
            except OSError:
                pass
            time.sleep(1.0)
        if first is None:
            raise RuntimeError(f"rlkit lab exited with code {proc.returncode} before its first step")
        t_stop = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=600)
        return {"to_first_step_s": first, "ctrl_c_to_exit_s": time.monotonic() - t_stop, "dtype": dtype}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def render(rows: list[dict]) -> str:
    lines = ["# CPU runs: the lab and `rlkit run` on each CPU seen", "",
             "Rendered by `lab/bench_cpu_runs.py` from lab/bench/cpu-runs.jsonl (one line per measurement).", "",
             "| date | commit | CPU | dtype | benchmark | metric | value |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['date']} | {r['commit']} | {r['cpu']} | {r['dtype']} | {r['benchmark']} | {r['metric']} "
                     f"| {r['value']:.1f} {r['unit']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["run", "lab"], default=None)
    args = p.parse_args(argv)
    common = {"cpu": hardware.summary(), "torch": hardware.describe()["torch"], "commit": commit(REPO),
              "date": datetime.date.today().isoformat()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp:
        for name, fn in (("rlkit run --steps 5", bench_run), ("rlkit lab to its first RL step", bench_lab)):
            if args.only and not name.startswith(f"rlkit {args.only}"):
                continue
            result = fn(Path(tmp) / name.split()[1])
            dtype = result.pop("dtype")
            for metric, value in result.items():
                rows.append({"benchmark": name, "metric": metric, "value": value, "unit": "s", "dtype": dtype,
                             **common})
                print(f"{name:32} {metric:22} {value:8.1f} s  ({dtype})", flush=True)
    ROWS.parent.mkdir(parents=True, exist_ok=True)
    with open(ROWS, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    all_rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    TABLE.write_text(render(all_rows))
    print(f"rows appended to {ROWS}; table {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
