"""Resume never loses or mixes a run; one writer per run directory.

The regression suite of the run directory's safety: a store without checkpoints is refused and left byte
for byte as it was (the committed H200 store included); checkpoint references are relative to the run
directory, so a copied run resumes from its own files, bit for bit; a checkpoint whose weights are not the
version the store recorded is refused; a resume takes its settings from the store (conflicting flags and
another contract are refused); steps committed after the checkpoint are recomputed and checked, never
deleted; a second writer is refused while the first holds the run's lock, and readers stay lock-free.

Small runs: the tiny model, 2 prompts x 2 samples, 4 new tokens, no warm start, the ASCII shaping term (so
the weights move at every step); one uninterrupted 4-step
reference and one run stopped after 2 steps (SIGTERM-like stop request) are shared by the module.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlkit import loop
from rlkit.cli import build_parser, run_config_from_args
from rlkit.timeline.lock import LOCK_NAME, RunLock, RunLocked, check_free, holder
from rlkit.timeline.records import bitwise_differences
from rlkit.timeline.store import RunStore
from tests.conftest import REPO

RUN_ARGS = ["--steps", "4", "--prompts", "2", "--samples", "2", "--max-tokens", "4", "--warm-start", "0",
            "--no-progress"]
H200_STORE = REPO / "lab" / "runs" / "h200-validation-2026-11-29" / "strict"


def config():
    """The RunConfig `rlkit run RUN_ARGS` builds, with the ASCII shaping term: without a warm start every
    task reward is 0, so the weights would never move (RunConfig.shaping); with it, each version differs
    and a checkpoint of the wrong version is detectable. A resume takes `shaping` from the store."""
    return run_config_from_args(build_parser().parse_args(["run", "--run-dir", "x", *RUN_ARGS])).replace(shaping=0.1)


def test_checkpoint_every_is_a_run_setting_a_resume_keeps():
    parse = lambda *extra: build_parser().parse_args(["run", "--run-dir", "x", *RUN_ARGS, *extra])  # noqa: E731
    assert run_config_from_args(parse()).checkpoint_every == 1
    assert run_config_from_args(parse("--checkpoint-every", "0")).checkpoint_every == 0
    assert run_config_from_args(parse("--checkpoint-every", "5")).checkpoint_every == 5
    from rlkit.cli import resume_conflicts
    args = build_parser().parse_args(["run", "--resume", "x", "--checkpoint-every", "3"])
    assert any("checkpoint" in c for c in resume_conflicts(args, {"checkpoint_every": 1})), \
        resume_conflicts(args, {"checkpoint_every": 1})


class _StopAfter:
    """Wraps a runner: asks the loop to stop once `version` is published (as SIGTERM would)."""

    def __init__(self, inner, stop: threading.Event, version: int):
        self.inner, self.stop, self.version = inner, stop, version

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def publish(self, version):
        out = self.inner.publish(version)
        if version == self.version:
            self.stop.set()
        return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(reference: 4 uninterrupted steps, stopped: the same run stopped after steps 0-1)."""
    root = tmp_path_factory.mktemp("resume")
    loop.run(root / "ref", config(), progress=False).close()
    stop, real = threading.Event(), loop.make_runner
    loop.make_runner = lambda *a, **k: _StopAfter(real(*a, **k), stop, 2)
    try:
        loop.run(root / "stopped", config(), progress=False, stop=stop).close()
    finally:
        loop.make_runner = real
    with RunStore.open(root / "stopped", readonly=True) as s:
        assert s.last_step() == 1 and s.last_checkpoint().step == 1
    with RunStore.open(root / "ref", readonly=True) as s:
        assert len({v.checksum for v in s.versions()}) == 5, "the weights must move at every step"
    return root / "ref", root / "stopped"


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlkit", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def one_line(res: subprocess.CompletedProcess, needle: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr and needle in res.stderr, res.stderr[-2000:]


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under run_dir -> sha256 of its bytes."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / LOCK_NAME).unlink(missing_ok=True)
    return dst


def same_run(a: Path, b: Path) -> None:
    """Every record, recompute and weight version of run a equals run b's, bit for bit."""
    with RunStore.open(a, readonly=True) as x, RunStore.open(b, readonly=True) as y:
        assert [s.step for s in x.steps()] == [s.step for s in y.steps()]
        for s in x.steps():
            got, want = x.records(s.step) + x.recomputes(s.step), y.records(s.step) + y.recomputes(s.step)
            assert len(got) == len(want) > 0
            for g, w in zip(got, want):
                assert not bitwise_differences(g, w), bitwise_differences(g, w)
        assert [v.checksum for v in x.versions()] == [v.checksum for v in y.versions()]
        assert all(s.ok for s in x.syncs())


# -- 1. a store without a checkpoint reference -------------------------------------------------------
@pytest.mark.parametrize("source", ["export", "h200"])
def test_resume_of_a_store_without_checkpoints_is_refused_and_changes_nothing(tmp_path, runs, source):
    """Issue 21 case 1: the loop used to truncate after step -1 (every step deleted) before it looked at
    the checkpoint or the device."""
    if source == "h200":  # the committed 200-step CUDA store: exported, so it holds no checkpoint reference
        run_dir = copy_run(H200_STORE, tmp_path / "h200")
    else:
        with RunStore.open(runs[1], readonly=True) as s:
            s.export(tmp_path / "exported")
        run_dir = tmp_path / "exported"
    before = snapshot(run_dir)
    one_line(cli("run", "--resume", str(run_dir), "--no-progress"), "no checkpoint reference")
    assert snapshot(run_dir) == before, "a refused resume changed the run directory"
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(before)


# -- 2. checkpoint paths, copies and foreign checkpoints ---------------------------------------------
def test_checkpoint_references_are_relative_to_the_run_directory(runs):
    with RunStore.open(runs[1], readonly=True) as s:
        assert [c.path for c in s.checkpoints()] == ["checkpoints/step-000000.pt", "checkpoints/step-000001.pt"]


def test_a_copied_run_resumes_from_its_own_files_bit_for_bit(tmp_path, runs):
    original = copy_run(runs[1], tmp_path / "original")
    copy = copy_run(original, tmp_path / "copy")
    shutil.rmtree(original)  # the copy must not need anything of the original
    res = cli("run", "--resume", str(copy), "--steps", "4", "--no-progress")  # a flag equal to the store's
    assert res.returncode == 0, res.stderr[-3000:]
    same_run(copy, runs[0])


def test_a_checkpoint_with_other_weights_is_refused_and_the_store_is_unchanged(tmp_path, runs):
    """Issue 21 case 2: any file under the checkpoint's name was loaded, and the run continued from the
    wrong weights. Here step 1's checkpoint holds step 0's weights (version 1, not version 2)."""
    run_dir = copy_run(runs[1], tmp_path / "run")
    shutil.copy(run_dir / "checkpoints" / "step-000000.pt", run_dir / "checkpoints" / "step-000001.pt")
    with RunStore.open(runs[1], readonly=True) as s:
        assert len({v.checksum for v in s.versions()}) == 3
    before = snapshot(run_dir)
    one_line(cli("run", "--resume", str(run_dir), "--no-progress"), "not this run's weights")
    after = snapshot(run_dir)
    # the database and the checkpoints, byte for byte; SQLite's own -wal (empty here) and -shm files may go
    # when the refused writer's connection closes, and the lock file it made is removed
    assert {k: v for k, v in after.items() if "sqlite-" not in k} == {k: v for k, v in before.items()
                                                                      if "sqlite-" not in k}
    assert LOCK_NAME not in after


def test_an_unreadable_checkpoint_is_refused(tmp_path, runs):
    run_dir = copy_run(runs[1], tmp_path / "run")
    (run_dir / "checkpoints" / "step-000001.pt").write_bytes(b"not a checkpoint")
    before = (run_dir / "run.sqlite").read_bytes()
    one_line(cli("run", "--resume", str(run_dir), "--no-progress"), "cannot load the checkpoint")
    assert (run_dir / "run.sqlite").read_bytes() == before


# -- 3. settings come from the store ---------------------------------------------------------------
def test_resume_refuses_flags_that_differ_from_the_store(tmp_path, runs):
    run_dir = copy_run(runs[1], tmp_path / "run")
    before = snapshot(run_dir)
    res = cli("run", "--resume", str(run_dir), "--steps", "20", "--path", "native", "--seed", "99")
    one_line(res, "--steps 20 (stored: 4), --path native (stored: 'strict'), --seed 99 (stored: 0)")
    assert snapshot(run_dir) == before


def test_resume_refuses_a_store_made_under_another_contract(tmp_path, runs):
    run_dir = copy_run(runs[1], tmp_path / "run")
    db = sqlite3.connect(run_dir / "run.sqlite")
    db.execute("UPDATE versions SET contract_fingerprint = 'qwen3-dense-strict-v0:0123456789abcdef'")
    db.commit()
    db.close()
    before = snapshot(run_dir)
    one_line(cli("run", "--resume", str(run_dir), "--no-progress"), "never continued under another contract")
    assert snapshot(run_dir) == before


# -- steps after the checkpoint are recomputed and checked, never deleted ----------------------------
def _drop_checkpoint_ref(run_dir: Path, step: int) -> None:
    db = sqlite3.connect(run_dir / "run.sqlite")
    db.execute("DELETE FROM checkpoints WHERE step = ?", (step,))
    db.commit()
    db.close()


def test_steps_after_the_checkpoint_are_recomputed_and_kept(tmp_path, runs):
    run_dir = copy_run(runs[1], tmp_path / "run")
    _drop_checkpoint_ref(run_dir, 1)  # as if the run checkpointed at step 0 only, then committed step 1
    with RunStore.open(run_dir, readonly=True) as s:
        row = s._conn.execute("SELECT commit_seq, committed_at, summary FROM steps WHERE step = 1").fetchone()
    res = cli("run", "--resume", str(run_dir), "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    with RunStore.open(run_dir, readonly=True) as s:
        assert s._conn.execute("SELECT commit_seq, committed_at, summary FROM steps WHERE step = 1").fetchone() == row
    same_run(run_dir, runs[0])


def test_a_recomputed_step_that_differs_from_the_store_stops_the_resume(tmp_path, runs):
    run_dir = copy_run(runs[1], tmp_path / "run")
    _drop_checkpoint_ref(run_dir, 1)
    db = sqlite3.connect(run_dir / "run.sqlite")
    db.execute("UPDATE records SET rollout_logprobs = zeroblob(length(rollout_logprobs)) "
               "WHERE rowid = (SELECT MIN(rowid) FROM records WHERE step = 1)")
    db.commit()
    db.close()
    before = (run_dir / "run.sqlite").read_bytes()
    one_line(cli("run", "--resume", str(run_dir), "--no-progress"), "step 1 recomputed from the checkpoint differs")
    assert (run_dir / "run.sqlite").read_bytes() == before


# -- 4. one writer per run directory -----------------------------------------------------------------
def test_the_lock_admits_one_writer_and_says_who_holds_it(tmp_path):
    check_free(tmp_path)
    assert holder(tmp_path) is None and not (tmp_path / LOCK_NAME).exists()  # probing creates nothing
    lock = RunLock.acquire(tmp_path)
    try:
        with pytest.raises(RunLocked, match=f"being written by process {os.getpid()}"):
            RunLock.acquire(tmp_path)
        assert holder(tmp_path) == os.getpid()
        with pytest.raises(RunLocked, match="being written by process"):
            check_free(tmp_path)
    finally:
        lock.release()
    assert holder(tmp_path) is None
    RunLock.acquire(tmp_path).release()


def test_a_second_writer_is_refused_and_writes_nothing_while_readers_read(tmp_path):
    """Issue 21 case 4: the second process computed a step, rewrote the checkpoints and inserted a sync row
    into the first run's timeline before it died."""
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "rlkit", "run", "--run-dir", str(run_dir), *RUN_ARGS,
                              "--steps", "50"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not ((run_dir / "run.sqlite").is_file() and holder(run_dir)):
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.2)
        assert holder(run_dir) == first.pid
        for args in (["--resume", str(run_dir), "--no-progress"], ["--run-dir", str(run_dir), *RUN_ARGS]):
            res = cli("run", *args)
            assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]
            assert f"being written by process {first.pid}" in res.stderr or "not empty" in res.stderr, res.stderr
        report = cli("report", str(run_dir), "--json")  # a reader: no lock, works beside the writer
        assert report.returncode == 0, report.stderr
    finally:
        first.send_signal(signal.SIGTERM)  # ends at a complete step
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    with RunStore.open(run_dir, readonly=True) as s:
        steps = [x.step for x in s.steps()]
        assert steps == list(range(len(steps)))
        # one engine: exactly one sync per version, all from the first writer
        assert [x.version for x in s.syncs()] == [v.version for v in s.versions()]
