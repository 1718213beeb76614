"""Following a run from another process while it appends: only complete steps, in order, each exactly once.

The writer is a subprocess (tests/timeline/writer.py) pacing its commits; this process follows it with a
StoreFollower and a Timeline, both on read-only connections, and checks every step it is shown against the
content the writer commits (make_step), bit for bit, while the writer is still running.
"""

from __future__ import annotations

import subprocess
import sys
import time

from rlkit.timeline import StoreFollower, Timeline
from tests.conftest import REPO
from tests.timeline.fakes import assert_step_complete, make_step

STEPS = 25


def test_a_follower_in_another_process_sees_only_complete_steps(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tests.timeline.writer", str(run_dir), str(STEPS),
                             "--sleep", "0.02"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    follower = StoreFollower(run_dir, missing_ok=True)  # may start before the run directory exists
    seen: list[int] = []
    seen_while_running = 0
    timeline = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = proc.poll() is None
        new = follower.poll()
        for summary in new:
            assert_step_complete(follower.store, summary.step)
        if new and running:
            seen_while_running += 1
        seen.extend(s.step for s in new)
        if follower.store is not None:
            timeline = timeline or Timeline(run_dir)
            records = timeline.records()
            steps = sorted(set(records["step"]))
            assert len(records) == len(steps) * len(make_step(0).records), "a step's records are partial"
            assert steps == list(range(len(steps)))
        if not running and not new:
            break
        time.sleep(0.005)
    assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()
    assert seen == list(range(STEPS)), f"followed steps out of order, repeated or missing: {seen}"
    assert seen_while_running >= 5, f"only {seen_while_running} polls overlapped the writer: not a live follow"
    follower.close()
    timeline.close()
