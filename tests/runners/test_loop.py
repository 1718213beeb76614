"""The RL loop end to end on the CPU: strict runs have zero mismatches at every step, native runs do not;
the on-policy and checksum guards refuse loudly; a killed run resumes bit for bit; bad input is one line.

Small runs: the tiny model, 2 prompts x 4 samples, 4 new tokens, no warm start.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlkit import loop
from rlkit.config import lab_default
from rlkit.runners import SyncError
from rlkit.timeline.records import bitwise_differences
from rlkit.timeline.store import RunStore, StoreFollower
from tests.negative import require_native_difference


def small(**kw):
    base = dict(steps=10, prompts_per_step=2, samples_per_prompt=4, max_tokens=4, warm_start_steps=0,
                locate_every=3)
    base.update(kw)
    return lab_default(**base)


def test_strict_run_has_zero_mismatch_at_every_step(tmp_path):
    store = loop.run(tmp_path / "strict", small(), progress=False)
    steps = store.steps()
    assert [s.step for s in steps] == list(range(10))
    for s in steps:
        assert s.mismatch_count == 0 and s.max_abs_diff == 0.0, s
        assert s.compared_tokens > 0 and s.valid and s.first_divergence is None
    assert [v.version for v in store.versions()] == list(range(11))
    assert all(sync.ok for sync in store.syncs())


def test_a_run_stores_how_it_ended(tmp_path, monkeypatch):
    """"run_state": running while the loop writes, then finished (every step) or stopped (a stop request
    ends it at a complete step), with the reason."""
    import threading

    done = loop.run(tmp_path / "done", small(steps=2), progress=False)
    assert done.info("run_state")["state"] == "finished"
    done.close()
    seen = {}
    original = loop.record_end

    def spy(store, cfg, exc):  # what the store said just before the run recorded its end
        seen["before_end"] = store.info("run_state")
        original(store, cfg, exc)

    monkeypatch.setattr(loop, "record_end", spy)
    stop = threading.Event()
    stopper = threading.Thread(target=_stop_when_a_step_is_in, args=(tmp_path / "stopped", stop))
    stopper.start()
    stopped = loop.run(tmp_path / "stopped", small(steps=50), progress=False, stop=stop)
    stopper.join()
    state, n = stopped.info("run_state"), len(stopped.steps())
    stopped.close()
    assert seen["before_end"]["state"] == "running" and seen["before_end"]["pid"] == os.getpid()
    assert 1 <= n < 50
    assert state["state"] == "stopped" and "stop request" in state["reason"]


def _stop_when_a_step_is_in(run_dir, stop) -> None:
    follower = StoreFollower(run_dir, missing_ok=True)
    deadline = time.time() + 600
    try:
        while not follower.poll() and time.time() < deadline:
            time.sleep(0.05)
    finally:
        follower.close()
        stop.set()


def test_native_run_mismatches_on_the_cpu(tmp_path):
    """fp32: the native path's GEMM and SDPA change bits between the engine's decode batches and the
    trainer's packed forward (in bf16 the tiny model's roundings hide most of it on the CPU)."""
    store = loop.run(tmp_path / "native", small(path="native", dtype="float32", steps=4), progress=False)
    steps = store.steps()
    require_native_difference(sum(s.mismatch_count for s in steps), "native fp32 run (step, mismatches, tokens, "
                              f"max |diff|): {[(s.step, s.mismatch_count, s.compared_tokens, s.max_abs_diff) for s in steps]}")
    located = [s.first_divergence for s in steps if s.first_divergence]
    assert located and located[0]["op"] in ("linear", "attention", "logprob"), located


class _Tamper:
    """Wraps a runner and corrupts one thing, to show the loop's guards refuse it."""

    def __init__(self, inner, what):
        self.inner, self.what = inner, what

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, requests, step):
        results = self.inner.generate(requests, step)
        if self.what == "stale" and step == 1:
            results[0].weight_version = 0  # a record from the previous version
        return results

    def sync(self, version, checksum):
        events = self.inner.sync(version, checksum)
        if self.what == "checksum" and version == 2:
            events[0] = type(events[0])(**{**events[0].to_dict(), "checksum_acknowledged": "0" * 16})
        return events


@pytest.mark.parametrize("what, error", [("stale", loop.StalenessError), ("checksum", SyncError)])
def test_guards_refuse_loudly(tmp_path, monkeypatch, what, error):
    real = loop.make_runner
    monkeypatch.setattr(loop, "make_runner", lambda *a, **k: _Tamper(real(*a, **k), what))
    with pytest.raises(error):
        loop.run(tmp_path / what, small(steps=4), progress=False)
    store = RunStore.open(tmp_path / what, readonly=True)
    if what == "stale":
        assert store.last_step() == 0  # nothing of step 1 counts
    else:
        steps = store.steps()
        assert [s.valid for s in steps] == [True, False] and "checksum" in steps[1].invalid_reason


def _cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "rlkit", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


RUN_ARGS = ["--steps", "6", "--prompts", "2", "--samples", "4", "--max-tokens", "4", "--warm-start", "0",
            "--no-progress"]


def _records(run_dir):
    store = RunStore.open(run_dir, readonly=True)
    out = []
    for s in store.steps():
        out.extend(store.records(s.step))
        out.extend(store.recomputes(s.step))
    return store, out


def test_kill_9_then_resume_is_bitwise_identical(tmp_path):
    # the uninterrupted reference and the victim are independent processes of one torch thread each: they
    # run side by side (2 cores); the victim's kill point is read from its own store
    ref = _cli("run", "--run-dir", str(tmp_path / "ref"), *RUN_ARGS)
    try:
        victim = _cli("run", "--run-dir", str(tmp_path / "victim"), *RUN_ARGS)
        follower = StoreFollower(tmp_path / "victim", missing_ok=True)
        seen = []
        deadline = time.time() + 600
        while len(seen) < 2 and time.time() < deadline:  # kill once two steps are in, mid-way through a third
            seen.extend(follower.poll())
            time.sleep(0.2)
        time.sleep(0.7)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        follower.close()
        killed_at = RunStore.open(tmp_path / "victim", readonly=True).last_step()
        assert killed_at is not None and killed_at < 5, f"the run finished before it could be killed ({killed_at})"
        resumed = _cli("run", "--resume", str(tmp_path / "victim"), "--no-progress")
        assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
        assert ref.wait(timeout=600) == 0, ref.stderr.read()
        ref_store, ref_records = _records(tmp_path / "ref")
        got_store, got_records = _records(tmp_path / "victim")
        assert len(got_records) == len(ref_records)
        for a, b in zip(got_records, ref_records):
            assert not bitwise_differences(a, b), bitwise_differences(a, b)
        assert [v.checksum for v in got_store.versions()] == [v.checksum for v in ref_store.versions()]
    finally:
        if ref.poll() is None:  # a failed check above: the reference is not left running
            ref.kill()
            ref.wait()


def test_follower_sees_complete_steps_only(tmp_path):
    proc = _cli("run", "--run-dir", str(tmp_path / "live"), *RUN_ARGS)
    follower = StoreFollower(tmp_path / "live", missing_ok=True)
    seen = []
    while proc.poll() is None:
        for s in follower.poll():
            store = follower.store
            assert len(store.records(s.step)) == 8 and len(store.recomputes(s.step)) == 8
            seen.append(s.step)
        time.sleep(0.2)
    seen.extend(s.step for s in follower.poll())
    assert proc.returncode == 0 and seen == list(range(6))


@pytest.mark.parametrize("args, needle", [
    (["run", "--run-dir", "X", "--steps", "0"], "expected an integer >= 1"),
    (["run", "--steps", "3"], "either --run-dir"),
    (["run", "--run-dir", "X", "--ops", "gemm=native"], "ops"),
    (["run", "--resume", "/nonexistent/run"], "no run directory"),
    (["report", "/nonexistent/run"], "no run directory"),
])
def test_bad_cli_input_is_one_clear_line(args, needle):
    res = subprocess.run([sys.executable, "-m", "rlkit", *args], capture_output=True, text=True)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_corrupt_run_dir_is_one_clear_line(tmp_path):
    (tmp_path / "run.sqlite").write_bytes(b"not a database at all" * 100)
    res = subprocess.run([sys.executable, "-m", "rlkit", "report", str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_report_json(tmp_path):
    loop.run(tmp_path / "r", small(steps=2), progress=False)
    res = subprocess.run([sys.executable, "-m", "rlkit", "report", str(tmp_path / "r"), "--json"],
                         capture_output=True, text=True, check=True)
    rows = json.loads(res.stdout)
    assert [r["step"] for r in rows] == [0, 1]
    assert set(rows[0]) == {"step", "weight_version", "compared_tokens", "mismatch_count", "max_abs_diff",
                            "reward_mean"}


@pytest.mark.megatron
def test_megatron_trainer_run_has_zero_mismatch_and_matches_the_embedded_trainer(tmp_path):
    """Issue 8's RL check: 5 steps with Megatron-core as the trainer record 0 mismatches, and the first
    step's trainer logprobs equal the embedded trainer's bit for bit (later steps differ: the two
    trainers' backward passes are not under the contract)."""
    cfg = small(steps=5, trainer="megatron")
    mega = loop.run(tmp_path / "megatron", cfg, progress=False)
    assert [s.mismatch_count for s in mega.steps()] == [0] * 5
    assert all(sync.ok for sync in mega.syncs())
    emb = loop.run(tmp_path / "embedded", cfg.replace(steps=1, trainer="embedded"), progress=False)
    a, b = mega.recomputes(0), emb.recomputes(0)
    assert len(a) == len(b) == 8
    for x, y in zip(a, b):
        assert not bitwise_differences(x, y), bitwise_differences(x, y)


def test_a_finished_run_releases_its_engines_and_trainer(tmp_path, monkeypatch):
    """The loop closes its runner: the engines (KV cache, decode graphs) and the trainer (model,
    optimizer) are gone even while something still holds the runner, so a second run in one process
    (lab/rl_step_ratio_h200.py: strict, then native) starts on a free GPU."""
    import gc
    import weakref

    held, refs = [], []
    real = loop.make_runner

    def keep(*args, **kwargs):
        runner = real(*args, **kwargs)
        held.append(runner)
        refs.extend(weakref.ref(o) for o in (runner.engines[0], runner.engines[0].cache, runner.trainer))
        return runner

    monkeypatch.setattr(loop, "make_runner", keep)
    loop.run(tmp_path / "r", small(steps=1), progress=False).close()
    gc.collect()
    assert len(held) == 1 and len(refs) == 3
    assert [r() is None for r in refs] == [True, True, True], "the closed runner still holds engine/cache/trainer"


def test_trainer_logprobs_reach_the_host_in_one_copy_unchanged():
    """`logprobs_to_host`: the per-sequence tensors, detached, on the CPU, the same values and lengths
    (views of one copy)."""
    import torch

    from rlkit.bitwise import assert_bitwise_equal
    from rlkit.runners.base import logprobs_to_host

    parts = [torch.randn(n, requires_grad=True) * 1.0 for n in (3, 1, 7)]
    out = logprobs_to_host(parts)
    assert [t.shape for t in out] == [t.shape for t in parts] and not any(t.requires_grad for t in out)
    for a, b in zip(out, parts):
        assert_bitwise_equal(a, b.detach(), "host copy")
    assert logprobs_to_host([]) == []


def test_a_run_whose_engine_releases_between_rollouts_is_the_same_run(tmp_path, monkeypatch):
    """`EngineConfig.release_when_idle`: the engine's KV cache is freed after each rollout, so it is gone
    while the trainer trains; the run stores the same records and weights as one that keeps the cache."""
    import dataclasses

    during_train = []
    real = loop.make_runner

    def watch(*args, **kwargs):
        runner = real(*args, **kwargs)
        train = runner.train_step
        runner.train_step = lambda batch: (during_train.append(runner.engines[0].allocated), train(batch))[1]
        return runner

    monkeypatch.setattr(loop, "make_runner", watch)
    base = small(steps=2)
    loop.run(tmp_path / "keep", base, progress=False).close()
    kept = list(during_train)
    during_train.clear()
    released = base.replace(engine=dataclasses.replace(base.engine, release_when_idle=True))
    loop.run(tmp_path / "release", released, progress=False).close()
    assert kept == [True] * 2 and during_train == [False] * 2, (kept, during_train)
    ref_store, ref_records = _records(tmp_path / "keep")
    got_store, got_records = _records(tmp_path / "release")
    assert len(got_records) == len(ref_records) > 0
    for a, b in zip(got_records, ref_records):
        assert not bitwise_differences(a, b), bitwise_differences(a, b)
    assert [v.checksum for v in got_store.versions()] == [v.checksum for v in ref_store.versions()]
