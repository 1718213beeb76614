"""The run store: round trips, the checks a commit makes, toggle requests, checkpoints, clear refusals."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
import torch

from rlkit.timeline import (SCHEMA_VERSION, Recompute, RunStore, StoreError, StoreFollower, SyncEvent,
                            ToggleEvent, WeightVersion)
from tests.timeline.fakes import (FP, SPECIAL, assert_record_bitwise, assert_step_complete, bits, initial,
                                  make_step)


@pytest.fixture
def store(tmp_path):
    s = RunStore.create(tmp_path / "run", {"preset": "tiny", "lr": 1e-5, "ops": ["attention"]})
    s.commit_initial(*initial())
    yield s
    s.close()


def commit(store, step, **kw):
    s = make_step(step)
    store.commit_step(s.summary, s.records, s.recomputes, s.versions, s.syncs, kw.pop("toggles", []), **kw)


def one_line_store_error(excinfo) -> str:
    msg = str(excinfo.value)
    err = excinfo.value
    assert "\n" not in msg, msg
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), \
        f"a traceback would show the chained {err.__context__!r}"
    return msg


def test_create_writes_config_schema_and_wal(store):
    assert store.config() == {"preset": "tiny", "lr": 1e-5, "ops": ["attention"]}
    assert store.schema_version == SCHEMA_VERSION
    assert store.last_step() is None and store.steps() == []
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [v.version for v in store.versions()] == [0] and len(store.syncs()) == 2


def test_steps_round_trip_bit_for_bit(store):
    for step in range(3):
        commit(store, step)
    assert store.last_step() == 2
    for step in range(3):
        assert_step_complete(store, step)
    assert [v.version for v in store.versions()] == [0, 1, 2, 3]
    again = RunStore.open(store.run_dir, readonly=True)
    assert_step_complete(again, 1)
    assert [s.ok for s in again.syncs()] == [True] * 8


def test_special_fp32_values_and_nan_reward_survive_the_store(store):
    values = np.concatenate([SPECIAL, [np.inf, np.float32("nan"), -1.0]]).astype(np.float32)
    s = make_step(0)
    rec = type(s.records[0]).from_dict(dict(s.records[0].to_dict(), rollout_logprobs=values.tolist(),
                                            token_ids=list(range(len(values))), reward=float("nan")))
    rc = Recompute(rec.record_id, 0, 0, FP, torch.from_numpy(values[::-1].copy()))
    store.commit_step(s.summary, [rec], [rc], s.versions, [], [])
    got, got_rc = store.records(0)[0], store.recomputes(0)[0]
    assert_record_bitwise(got, rec)
    assert (bits(got.rollout_logprobs) == values.view(np.uint32)).all()
    t = torch.tensor(got.rollout_logprobs)
    assert torch.equal(t[:7], torch.from_numpy(values[:7])) and torch.equal(t.signbit(), torch.from_numpy(values).signbit())
    assert (bits(got_rc.trainer_logprobs) == values[::-1].view(np.uint32)).all()
    assert np.isnan(got.reward)


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s.summary.__class__.from_dict(dict(s.summary.to_dict(), step=0)), "step 0 cannot follow step 0"),
    (lambda s: s.records.append(make_step(9).records[0]), "commit of step 1 holds a record of step 9"),
    (lambda s: s.records.append(s.records[0]), "record s1/p0/0 appears twice in one step"),
    (lambda s: s.records.__setitem__(0, make_step(0).records[0].__class__.from_dict(
        dict(make_step(0).records[0].to_dict(), step=1))), "record s0/p0/0 is already in the store"),
    (lambda s: s.recomputes.append(Recompute("nope", 1, 1, FP, [])), "names record nope, which is not in"),
    (lambda s: s.recomputes.__setitem__(0, Recompute(s.records[0].record_id, 1, 1, FP, [-1.0] * 999)),
     "has 999 logprobs for"),
    (lambda s: s.syncs.append(SyncEvent("engine-0", 42, "a", "a", 0.0, 1.0)), "names weight version 42"),
    (lambda s: s.versions.append(WeightVersion(1, 0, "x", FP, 0.0)), "weight version 1 is already in the store"),
    (lambda s: s.records.__setitem__(0, s.records[0].__class__.from_dict(
        dict(s.records[0].to_dict(), weight_version=7))), "record s1/p0/0 names weight version 7"),
    (lambda s: s.recomputes.__setitem__(0, Recompute(s.records[0].record_id, 0, 1, FP, [])),
     "commit of step 1 holds a recompute of step 0"),
])
def test_a_refused_commit_writes_nothing(store, mutate, match):
    commit(store, 0)
    s = make_step(1)
    replaced = mutate(s)
    summary = replaced if replaced is not None else s.summary
    with pytest.raises(StoreError, match=match):
        store.commit_step(summary, s.records, s.recomputes, s.versions, s.syncs, [])
    assert store.last_step() == 0 and store.records(1) == [] and len(store.versions()) == 2
    assert len(store.syncs()) == 4
    commit(store, 1)  # the store is still writable and the real step goes in
    assert_step_complete(store, 1)


def test_readonly_store_refuses_writes(store):
    ro = RunStore.open(store.run_dir, readonly=True)
    with pytest.raises(StoreError, match="opened read-only"):
        commit(ro, 0)
    with pytest.raises(StoreError, match="opened read-only"):
        ro.request_toggle("attention", "native", "dashboard")


def test_create_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("x")
    with pytest.raises(StoreError) as e:
        RunStore.create(tmp_path / "old", {})
    assert "refusing to create a run in" in one_line_store_error(e) and "not empty" in str(e.value)
    with pytest.raises(StoreError, match="not JSON-serializable"):
        RunStore.create(tmp_path / "new", {"f": object()})


def _set_schema(run_dir, version):
    conn = sqlite3.connect(run_dir / "run.sqlite")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_another_schema_version_is_refused_naming_both(store, readonly):
    store.close()
    _set_schema(store.run_dir, SCHEMA_VERSION + 1)
    with pytest.raises(StoreError) as e:
        RunStore.open(store.run_dir, readonly=readonly)
    msg = one_line_store_error(e)
    assert f"has schema version {SCHEMA_VERSION + 1}; this rlkit reads schema version {SCHEMA_VERSION}" in msg


def test_missing_foreign_and_corrupt_run_dirs_give_one_clear_line(tmp_path):
    cases = {}
    cases["missing"] = (tmp_path / "nowhere", "no run directory at")
    (tmp_path / "plain").mkdir()
    cases["no db"] = (tmp_path / "plain", "is not an rlkit run directory (no run.sqlite)")
    (tmp_path / "afile").write_text("x")
    cases["file"] = (tmp_path / "afile", "is not a directory")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "run.sqlite").write_bytes(np.random.default_rng(0).bytes(8192))
    cases["corrupt"] = (garbage, "is not a readable rlkit run store (file is not a database)")
    other = tmp_path / "other"
    other.mkdir()
    sqlite3.connect(other / "run.sqlite").execute("CREATE TABLE t (x)").connection.close()
    cases["foreign sqlite"] = (other, "is an SQLite file but not an rlkit run store")
    for name, (path, expected) in cases.items():
        for readonly in (False, True):
            with pytest.raises(StoreError) as e:
                RunStore.open(path, readonly=readonly)
            assert expected in one_line_store_error(e), f"{name}: {e.value}"
    with pytest.raises(StoreError, match="no run directory at"):
        StoreFollower(tmp_path / "nowhere")
    assert StoreFollower(tmp_path / "nowhere", missing_ok=True).poll() == []


def test_a_truncated_store_file_is_a_store_error(store):
    commit(store, 0)
    store.close()
    db = store.run_dir / "run.sqlite"
    db.write_bytes(db.read_bytes()[:100] + b"\x00" * 4000)
    with pytest.raises(StoreError) as e:
        RunStore.open(store.run_dir).steps()
    one_line_store_error(e)


def test_toggle_request_pending_then_applied_in_the_step_commit(store):
    dashboard = RunStore.open(store.run_dir)  # another connection, as a dashboard process would hold
    rid = dashboard.request_toggle("attention", "native", "dashboard")
    rid2 = dashboard.request_toggle("linear", "native", "notebook")
    assert rid2 > rid
    pending = store.pending_toggles()
    assert [(p.request_id, p.op, p.path, p.source) for p in pending] == [
        (rid, "attention", "native", "dashboard"), (rid2, "linear", "native", "notebook")]
    event = ToggleEvent(0, "attention", "native", pending[0].requested_at, pending[0].requested_at + 1,
                        "dashboard", "fp-after", request_id=rid)
    commit(store, 0, toggles=[event])
    assert [p.request_id for p in dashboard.pending_toggles()] == [rid2]
    assert dashboard.toggles() == [event]
    again = ToggleEvent(1, "attention", "native", 0.0, 1.0, "dashboard", "fp", request_id=rid)
    with pytest.raises(StoreError, match=f"answers request {rid}, which is already applied at step 0"):
        commit(store, 1, toggles=[again])
    with pytest.raises(StoreError, match="toggle request refused: unknown op 'softmax'; ops: rms_norm"):
        dashboard.request_toggle("softmax", "native", "dashboard")
    with pytest.raises(StoreError, match="unknown path 'fast'"):
        dashboard.request_toggle("attention", "fast", "dashboard")


def test_checkpoint_refs_and_truncate_for_resume(store):
    commit(store, 0, checkpoint="ckpt/0")
    commit(store, 1)
    store.save_checkpoint_ref(1, "ckpt/1")
    rid = store.request_toggle("rope", "native", "dashboard")
    commit(store, 2, toggles=[ToggleEvent(2, "rope", "native", 0.0, 1.0, "dashboard", "f", request_id=rid)])
    assert (store.last_checkpoint().step, store.last_checkpoint().path) == (1, "ckpt/1")
    assert [c.step for c in store.checkpoints()] == [0, 1]
    with pytest.raises(StoreError, match="checkpoint of step 9: the step is not in the store"):
        store.save_checkpoint_ref(9, "x")

    follower = StoreFollower(store.run_dir)
    assert [s.step for s in follower.poll()] == [0, 1, 2]
    store.truncate_after(0)  # resume from the checkpoint of step 0: steps 1 and 2 are redone
    assert store.last_step() == 0 and store.last_checkpoint().step == 0
    assert [v.version for v in store.versions()] == [0, 1] and len(store.syncs()) == 4
    assert store.records(1) == [] and store.toggles() == []
    assert [p.request_id for p in store.pending_toggles()] == [rid]
    commit(store, 1)
    assert [s.step for s in follower.poll()] == [1], "a redone step is news to a follower"
    assert_step_complete(store, 1)


def test_export_keeps_every_step_and_the_token_data_of_sampled_steps(store, tmp_path):
    for step in range(6):
        commit(store, step)
    copy_path = store.export(tmp_path / "small", token_steps_every=3)
    small = RunStore.open(copy_path.parent, readonly=True)
    assert [s.step for s in small.steps()] == list(range(6))
    assert [v.version for v in small.versions()] == [v.version for v in store.versions()]
    for step in range(6):
        kept = step % 3 == 0
        assert (len(small.records(step)) > 0) == kept and (len(small.recomputes(step)) > 0) == kept, step
    assert_step_complete(small, 3)
    assert small._conn.execute("SELECT value FROM meta WHERE key = 'token_steps_every'").fetchone()[0] == "3"
    full = store.export(tmp_path / "full")
    assert_step_complete(RunStore.open(full.parent, readonly=True), 5)
    with pytest.raises(StoreError, match="exists"):
        store.export(tmp_path / "full")
