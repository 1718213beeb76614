"""Seeded fault injection: `kill -9` an `rlkit run` at random points across its steps and checkpoint writes,
resume it each time, and the finished run equals an uninterrupted one bit for bit; nothing is ever lost.

Each round starts `tests/runners/victim.py` (the real `rlkit run`, with one kill hook) on the same run
directory: a new run the first time, `--resume` afterwards. The seed picks each round's kill point and
when it fires (the n-th occurrence in that process, n within the steps left):
- in the resume's re-sync commit, at the start of a step's train update (after its rollout), inside a
  step's transaction (after some records, before the steps row, at COMMIT);
- half-way through writing a checkpoint file; with the checkpoint in place but the step not committed;
  after the commit, before old checkpoints are pruned.
After every kill: the store passes SQLite's integrity check, holds steps 0..k without a gap, has lost no
step it held before, and its newest checkpoint reference has its file. A last, uninterrupted resume
finishes the run; every record, recompute and weight checksum then equals the reference run's.

Small: the tiny model, 3 steps of 2 prompts x 2 samples, 4 new tokens, no warm start, the ASCII shaping term
(the weights move at every step: tests/runners/test_resume.py's config); 4 kills.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys

import pytest

from rlkit import loop
from rlkit.rundir import checkpoint_file
from rlkit.timeline.store import RunStore
from tests.conftest import REPO
from tests.runners.test_resume import config, same_run

SEED = 20261201
STEPS = 3
ROUNDS = 4
# (kill point, occurrences per step): n is drawn from 1 .. per_step x (the next one or two steps)
STEP_POINTS = [("train", 1), ("sql:INSERT INTO records", 4), ("sql:INSERT INTO steps", 1), ("ckpt-partial", 1),
               ("ckpt-written", 1), ("committed", 1)]
RESYNC = ("sql:INSERT INTO syncs", 1)  # only in a resumed process: the re-sync before its first step


def victim(point: str, nth: int, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.runners.victim", point, str(nth), "--", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def check_after_kill(run_dir, before: int) -> int:
    """The store is sound, gap-free, has lost nothing, and can resume; returns its complete steps."""
    if not (run_dir / "run.sqlite").is_file():
        return 0
    with RunStore.open(run_dir, readonly=True) as s:
        assert s.integrity_problems() == []
        steps = [x.step for x in s.steps()]
        assert steps == list(range(len(steps))), steps
        assert len(steps) >= before, f"steps were lost: {before} -> {len(steps)}"
        ckpt = s.last_checkpoint()
        if steps:
            assert ckpt is not None and checkpoint_file(run_dir, ckpt).exists(), ckpt
        return len(steps)


@pytest.mark.slow
def test_kill_9_at_seeded_points_then_resume_equals_the_uninterrupted_run(tmp_path):
    rng = random.Random(SEED)
    cfg = config().replace(steps=STEPS)
    loop.run(tmp_path / "reference", cfg, progress=False).close()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    run_dir = tmp_path / "victim"
    done, kills = 0, []
    # distinct step-level points, and the re-sync kill in one of the resumed rounds
    plan = rng.sample(STEP_POINTS, ROUNDS - 1)
    plan.insert(rng.randint(1, ROUNDS - 1), RESYNC)
    for round_, (point, per_step) in enumerate(plan):
        started = (run_dir / "run.sqlite").is_file()
        left = STEPS - done
        if point == RESYNC[0] or left == 0:
            point, nth = RESYNC if started else (point, 1)
        else:
            nth = rng.randint(1, per_step * min(2, left))  # within the next two steps of this process
        args = (["run", "--resume", str(run_dir), "--no-progress"] if started
                else ["new", str(run_dir), str(tmp_path / "config.json")])
        res = victim(point, nth, args)
        kills.append(f"{point} #{nth} (after {done} steps)")
        assert res.returncode == -signal.SIGKILL, f"round {round_}, {kills[-1]}: rc {res.returncode}\n{res.stderr[-3000:]}"
        done = check_after_kill(run_dir, done)
    res = subprocess.run([sys.executable, "-m", "rlkit", "run", "--resume", str(run_dir), "--no-progress"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert check_after_kill(run_dir, done) == STEPS
    same_run(run_dir, tmp_path / "reference")
    print(f"kill points survived: {len(kills)}: {kills}")
