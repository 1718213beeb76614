"""Issue 17's live picture on the lent GPU, in one call: an RL run under the RayRunner (the trainer and the
rollout engine as Ray actors sharing the GPU), `rlkit dashboard` serving its store while it writes, and
this script checking through the dashboard's HTTP API what a user would see and do.

Checks (each a JSON line; exit 1 if one fails):
1. GET /api/status shows the run's step count rising while it runs, seen one step at a time at least
   once (the status is polled every 0.25 s and every count seen is printed);
2. POST /api/toggle {"run", "op": "attention", "path": "native"} after step `--toggle-after` is stored
   (the answer names a request id);
3. the store, once the run has ended: one ToggleEvent for attention -> native from the API (source "api"),
   applied at a step boundary; that step's summary ran attention native (its ops' paths and contract
   fingerprint), the step before it strict; the strict steps before it have 0 mismatches;
4. the run stored where its ranks were placed (the Ray GPU ids of the trainer and engine actors) and
   ended "finished"; the dashboard's log has no traceback.

There (the carry of `lab/device_carry.py build --with dashboard`, installed first):
    python3 lab/device_carry.py install /tmp/site && export PYTHONPATH=/tmp/site RLKIT_DATA=.thirdparty/device/data
    python3 lab/live_dashboard_h200.py --out $W/live
Here (CPU, tiny preset, a local Ray cluster; about two minutes):
    .venv/bin/python lab/live_dashboard_h200.py --dry-run --out /tmp/live
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rlkit.distributed import free_port
from rlkit.timeline import RunStore

RUN = "live"


def report(check: str, ok: bool, **fields) -> bool:
    print(json.dumps(dict(check=check, ok=ok, **fields)), flush=True)
    return ok


def http(method: str, url: str, body: dict | None = None) -> tuple[int, dict | str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text, code = r.read().decode(), r.status
    except urllib.error.HTTPError as e:
        text, code = e.read().decode(), e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


def run_args(run_dir: Path, a) -> list[str]:
    size = (["--preset", "tiny", "--device", "cpu", "--dtype", "fp32", "--threads", "1"] if a.dry_run else
            ["--preset", "qwen3-0.6b", "--device", "cuda", "--dtype", "bf16"])
    return ["run", "--run-dir", str(run_dir), "--runner", "ray", "--task", "arith", "--steps", str(a.steps),
            "--prompts", "4", "--samples", "4", "--max-tokens", "32", "--warm-start", "0", "--no-progress",
            # no trainer checkpoints: on the H200 a 0.6b trainer's (~7 GB) took most of each ~20 s step
            # (lab/LOG.md 2026-12-01 session 6); this check resumes nothing
            "--checkpoint-every", "0", *size]


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlkit", *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen, wait_s: float = 30.0) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def steps_seen(status) -> int | None:
    if not isinstance(status, dict):
        return None
    run = next((r for r in status.get("runs", []) if r.get("label") == RUN), None)
    return None if run is None else int(run.get("steps") or 0)


def check_store(run_dir: Path) -> bool:
    with RunStore.open(run_dir, readonly=True) as s:
        events, summaries = s.toggles(), {x.step: x for x in s.steps()}
        state, placement = s.info("run_state"), s.info("placement")
    ok = report("the toggle was recorded", len(events) == 1, events=[e.to_dict() for e in events])
    if events:
        ev = events[0]
        after, before = summaries.get(ev.step), summaries.get(ev.step - 1)
        ok &= report("the step after the toggle ran attention native; the one before strict",
                     ev.op == "attention" and ev.path == "native" and ev.source == "api" and after is not None
                     and after.ops_paths["attention"] == "native" and after.contract_fingerprint == ev.new_fingerprint
                     and before is not None and before.ops_paths["attention"] == "strict",
                     step=ev.step, after=after and after.ops_paths, before=before and before.ops_paths)
        strict = [x for x in summaries.values() if x.step < ev.step]
        ok &= report("strict steps before the toggle have 0 mismatches",
                     bool(strict) and all(x.mismatch_count == 0 for x in strict),
                     mismatches=[x.mismatch_count for x in strict], compared=[x.compared_tokens for x in strict])
        native = [x for x in summaries.values() if x.step >= ev.step]
        report("native-attention steps (a control: mismatches are allowed)", True,
               mismatches=[x.mismatch_count for x in native], max_abs_diff=[x.max_abs_diff for x in native])
    ok &= report("the run finished and stored its placement", (state or {}).get("state") == "finished"
                 and bool(placement), run_state=state, placement=placement)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="a new folder: the run store and the logs")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--toggle-after", type=int, default=4, help="post the toggle once this many steps are in")
    ap.add_argument("--minutes", type=float, default=6.0, help="give up after this long")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, a local Ray cluster")
    a = ap.parse_args()
    if a.out.exists() and any(a.out.iterdir()):
        print(f"--out {a.out} exists and is not empty", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    run_dir = a.out / RUN
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    run = start(run_args(run_dir, a), a.out / "run.log")
    dash = start(["dashboard", str(run_dir), "--wait", "--port", str(port), "--period-ms", "250"],
                 a.out / "dashboard.log")
    deadline, seen, toggled, ok = time.time() + a.minutes * 60, [], False, True
    try:
        while time.time() < deadline:
            code, status = http("GET", f"{base}/api/status")
            n = steps_seen(status) if code == 200 else None
            if n is not None and (not seen or n != seen[-1]):
                seen.append(n)
                print(json.dumps(dict(status_steps=n, t=round(time.time() - (deadline - a.minutes * 60), 1))),
                      flush=True)
            if n is not None and n >= a.toggle_after and not toggled:
                code, body = http("POST", f"{base}/api/toggle", {"run": RUN, "op": "attention", "path": "native"})
                ok &= report("the toggle request was stored", code == 200 and isinstance(body, dict)
                             and "request_id" in body, code=code, body=body, at_steps=n)
                toggled = True
            if run.poll() is not None:
                break
            time.sleep(0.25)
        code, status = http("GET", f"{base}/api/status")
        final = steps_seen(status) if code == 200 else None
        if final is not None and final != (seen[-1] if seen else None):
            seen.append(final)
        ok &= report("the run ended inside the time budget", run.poll() == 0, returncode=run.poll())
        ok &= report("the status advanced while the run ran, one step at a time at least once",
                     len(seen) >= 3 and seen == sorted(seen) and (seen[-1] if seen else 0) == a.steps
                     and any(b - a_ == 1 for a_, b in zip(seen, seen[1:])), seen=seen)
        ok &= report("the toggle was posted mid-run", toggled)
    finally:
        stop(run)
        stop(dash)
    log = (a.out / "dashboard.log").read_text()
    ok &= report("no traceback in the dashboard's log", "Traceback" not in log, tail=log[-500:])
    if run_dir.exists():
        ok &= check_store(run_dir)
    print(json.dumps(dict(live_dashboard="ok" if ok else "FAILED")), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
