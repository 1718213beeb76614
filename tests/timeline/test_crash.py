"""SIGKILL a writer subprocess at random points: the store keeps only complete steps, and writing goes on.

Each round starts `tests/timeline/writer.py` on the same run directory (it continues after the last complete
step) and kills it either from SQLite's statement trace, in the middle of a step's transaction (after
some records, after the recomputes, before the steps row, right before COMMIT), or from the outside after a
random delay (a timer thread in the writer). After every kill the store is reopened: its steps are exactly 0..last, each one bit for bit
what the writer was committing (make_step), and nothing of the torn step is left anywhere. The seed makes a
failing sequence of kill points reproducible.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys

from rlkit.timeline import RunStore
from tests.conftest import REPO
from tests.timeline.fakes import ENGINES, assert_step_complete

TOTAL_STEPS = 60  # more than 8 rounds can reach: at most 4 x 3 steps inside, 4 x ~10 timed
# Statements per step of the fake writer: 8 records, 8 recomputes, 1 steps row, 1 COMMIT.
INSIDE = ("INSERT INTO records", "INSERT INTO recomputes", "INSERT INTO steps", "COMMIT")


def writer(run_dir, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.timeline.writer", str(run_dir), str(TOTAL_STEPS), *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_only_complete_steps(run_dir, checked: set[int]) -> int:
    store = RunStore.open(run_dir)
    try:
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        last = store.last_step()
        steps = [s.step for s in store.steps()]
        assert steps == list(range(last + 1)) if last is not None else steps == [], steps
        for step in set(steps) - checked:  # earlier rounds verified the others; they cannot change
            assert_step_complete(store, step)
            checked.add(step)
        n = (last if last is not None else -1) + 1
        leftovers = store._conn.execute(
            "SELECT (SELECT COUNT(*) FROM records WHERE step >= ?), (SELECT COUNT(*) FROM recomputes WHERE step >= ?),"
            " (SELECT COUNT(*) FROM versions), (SELECT COUNT(*) FROM syncs)", (n, n)).fetchone()
        assert leftovers == (0, 0, n + 1, len(ENGINES) * (n + 1)), f"torn step {n} left rows behind: {leftovers}"
        return n
    finally:
        store.close()


def test_sigkill_at_random_points_keeps_complete_steps_and_writing_continues(tmp_path):
    rng = random.Random(20261129)
    run_dir = tmp_path / "run"
    checked: set[int] = set()
    done, kills = 0, []
    for round_ in range(8):
        if round_ % 2 == 0:  # from inside a step's transaction
            prefix = rng.choice(INSIDE)
            per_step = 8 if prefix.startswith(("INSERT INTO rec")) else 1
            nth = rng.randint(1, 3 * per_step)  # somewhere in the first three steps of this round
            proc = writer(run_dir, "--die-at", prefix, str(nth))
            kills.append(f"{prefix} #{nth}")
        else:  # at a random moment after the writer's first commit; 5 ms pauses bound the steps per round
            delay = rng.uniform(0.0, 0.05)
            proc = writer(run_dir, "--die-after", f"{delay:.4f}", "--sleep", "0.005")
            kills.append(f"after {delay * 1000:.1f} ms")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"round {round_} ({kills[-1]}): rc {proc.returncode}: {err}"
        now = assert_only_complete_steps(run_dir, checked)
        assert now >= done, f"round {round_}: the store lost steps ({done} -> {now})"
        assert now < TOTAL_STEPS, "the writer finished before it was killed; the test proves nothing"
        done = now
    proc = writer(run_dir)  # a final, uninterrupted writer completes the run
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert assert_only_complete_steps(run_dir, checked) == TOTAL_STEPS
    assert done > 0, f"no round committed anything: {kills}"


def test_a_kill_inside_the_transaction_leaves_uncommitted_frames_that_are_ignored(tmp_path):
    """The mid-transaction kill is real: pages of the torn step reached the WAL before the kill."""
    run_dir = tmp_path / "run"
    proc = writer(run_dir, "--die-at", "COMMIT", "2")  # commits step 0, dies committing step 1
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    wal = run_dir / "run.sqlite-wal"
    frames = (wal.stat().st_size - 32) // (4096 + 24)
    raw = sqlite3.connect(run_dir / "run.sqlite")
    committed_frames = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    raw.close()
    assert frames > committed_frames, f"WAL holds {frames} frames, {committed_frames} committed: nothing torn"
    assert assert_only_complete_steps(run_dir, set()) == 1
