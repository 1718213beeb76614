"""`rlkit lab` end to end: a strict and a native run side by side with the dashboard on both, and Ctrl-C
(SIGINT, what a terminal sends) stopping everything with complete records. Also the CLI's refusals.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import urllib.request

from rlkit.timeline import RunStore
from tests.conftest import REPO
from tests.dashboards.conftest import WAIT_S, free_port, http, rlkit, wait_for

STEPS = 400


def test_lab_serves_both_runs_and_ctrl_c_stops_everything_with_complete_steps(tmp_path):
    port, log = free_port(), tmp_path / "lab.log"
    runs_dir = tmp_path / "runs"
    proc = rlkit("lab", "--steps", str(STEPS), "--warm-start", "0", "--prompts", "2", "--samples", "2",
                 "--runs-dir", str(runs_dir), "--port", str(port), log=log)
    try:
        def both_stepping():
            code, body = http("GET", f"http://127.0.0.1:{port}/api/status")
            return code == 200 and all(r.get("steps", 0) >= 1 for r in body["runs"]) and body

        status = wait_for("both lab runs to commit a step", both_stepping, proc=proc, log=log)
        assert [r["label"] for r in status["runs"]] == ["strict", "native"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as page:
            assert page.status == 200 and b"bokeh" in page.read().lower()
        (lab_dir,) = runs_dir.iterdir()
        pids = {kind: r["pid"] for kind, r in json.loads((lab_dir / "lab.json").read_text())["runs"].items()}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert f"dashboard at http://localhost:{port}/" in text
    assert "stopping strict, native" in text or "stopping native, strict" in text, text
    assert "Traceback" not in text, text
    for kind, pid in pids.items():  # no run left behind
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, f"the {kind} run (pid {pid}) outlived the lab"
    for kind in ("strict", "native"):
        with RunStore.open(lab_dir / kind, readonly=True) as store:
            cfg, steps = store.config(), store.steps()
            assert cfg["path"] == kind and cfg["dtype"] == "float32"
            assert 1 <= len(steps) < STEPS, f"{kind}: {len(steps)} steps"
            for s in steps:  # the SIGTERM let the loop finish its step: every step is whole
                assert len(store.records(s.step)) == 4 and len(store.recomputes(s.step)) == 4
                assert set(s.ops_paths.values()) == {kind}
            if kind == "strict":
                assert all(s.mismatch_count == 0 for s in steps), "the strict path mismatched in fp32"


def test_cli_refuses_a_non_loopback_address_without_a_token(tmp_path):
    for cmd in (["dashboard", str(tmp_path)], ["lab", "--runs-dir", str(tmp_path)]):
        r = subprocess.run([sys.executable, "-m", "rlkit", *cmd, "--address", "0.0.0.0"], cwd=REPO,
                           capture_output=True, text=True, timeout=WAIT_S)
        assert r.returncode == 2 and "is not loopback" in r.stderr and "--token" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == [], "a refused lab must not start anything"
    r = subprocess.run([sys.executable, "-m", "rlkit", "dashboard", str(tmp_path / "missing")], cwd=REPO,
                       capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 2 and "no run directory" in r.stderr and "--wait" in r.stderr, r.stderr


def test_ctrl_c_during_the_warm_start_stops_the_runs_and_the_status_shows_the_warm_start(tmp_path):
    """A run still in its warm start honours the lab's SIGTERM between two warm-start steps (it used to
    finish the whole warm start first), and the dashboard's status reports the warm start's progress and
    the dtype the run chose, so a newcomer does not watch empty charts."""
    port, log = free_port(), tmp_path / "lab.log"
    runs_dir = tmp_path / "runs"
    proc = rlkit("lab", "--steps", "5", "--warm-start", "100000", "--runs-dir", str(runs_dir), "--port", str(port),
                 log=log)
    try:
        def both_warming_up():
            code, body = http("GET", f"http://127.0.0.1:{port}/api/status")
            return (code == 200 and all((r.get("progress") or {}).get("step", 0) >= 1 for r in body["runs"])
                    and body)

        status = wait_for("both lab runs to report warm-start steps", both_warming_up, proc=proc, log=log)
        for r in status["runs"]:
            progress, platform = r["progress"], r["platform"]
            assert r["steps"] == 0 and progress["phase"] == "warm start" and progress["total"] == 100000, r
            assert math.isfinite(progress["loss"]) and progress["eta_s"] > 0, progress
            assert platform["dtype"] == "float32" and platform["dtype_reason"] == "float32 was asked for", platform
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "runs killed" not in text, f"the runs did not stop by themselves during the warm start:\n{text}"
    assert "Traceback" not in text, text
    (lab_dir,) = runs_dir.iterdir()
    for kind in ("strict", "native"):
        run_log = (lab_dir / f"{kind}.log").read_text()
        assert "stopped during the warm start" in run_log and "no step was written" in run_log, run_log[-2000:]
        with RunStore.open(lab_dir / kind, readonly=True) as store:
            assert store.steps() == []
