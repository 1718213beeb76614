"""The dashboard's param state without a browser: loading runs, following new steps, the drill-down, the
heatmap data, toggle requests written into the run's store, and the token and address policy.

Runs here are fake stores written step by step (tests/timeline/fakes.py content): the state reads exactly
what rlkit.loop commits, without a model. The real loop applying a toggle is in test_browser.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlkit.dashboards.access import (AccessError, TokenRefused, check_serve_policy, check_token, is_loopback,
                                     session_token, token_matches)
from rlkit.dashboards.figures import HeatmapChart
from rlkit.dashboards.state import (EQUAL_Z, MAX_Z, MIN_Z, DashboardState, RunState, TokenText, diff_z,
                                    initial_paths, run_labels)
from rlkit.timeline import RunStore, StoreError, Timeline
from rlkit.timeline.timeline import mismatches
from tests.conftest import REPO
from tests.dashboards.conftest import FakeRun, labelled_text
from tests.timeline.fakes import make_step


def state_of(*runs: FakeRun, **params) -> DashboardState:
    return DashboardState.from_run_dirs([r.run_dir for r in runs], token_text=TokenText(labelled_text), **params)


def test_loads_a_run_with_its_summaries_versions_syncs_and_records(fake_run):
    fake_run.commit(3)
    run = RunState(fake_run.run_dir)
    assert run.poll() == [0, 1, 2]
    assert run.exists and run.n_steps == 3 and not run.finished and run.planned_steps == 6
    for i, row in run.steps.iterrows():
        want = make_step(i).summary
        assert row["mismatch_count"] == want.mismatch_count
        assert row["max_abs_diff"] == want.max_abs_diff
        assert row["ratio_spread"] == want.ratio_max - want.ratio_min
        assert row["reward_mean"] == want.reward_mean
        assert np.isnan(row["k3_kl"]) == np.isnan(want.k3_kl)
    assert list(run.versions["version"]) == [0, 1, 2, 3]
    assert len(run.syncs) == 2 * 4 and run.syncs["ok"].all()
    tl = Timeline(fake_run.run_dir)
    want_records = tl.records()
    assert list(run.records["record_id"]) == list(want_records["record_id"])
    assert list(run.records["mismatch_count"]) == list(want_records["mismatch_count"])
    assert run.paths == {op: "strict" for op in run.paths} and len(run.paths) == 7
    assert run.status().startswith("fake: steps 0–2 (3 of 6 steps so far)")
    run.close()


def test_a_warming_up_run_shows_the_warm_start_until_its_first_step(tmp_path):
    fake = FakeRun(tmp_path / "warm", steps=4)
    run = RunState(fake.run_dir)
    run.poll()
    assert run.progress is None and run.status() == "warm: no step yet (0 of 4 steps so far)"
    revision = run.revision
    fake.store.set_info("progress", {"phase": "warm start", "step": 30, "total": 100, "loss": 2.3456,
                                     "elapsed_s": 45.0, "eta_s": 105.0})
    run.poll()
    assert run.revision == revision + 1 and run.progress["step"] == 30
    assert run.status() == ("warm: no step yet — warm start 30 of 100 steps, loss 2.35, about 1 min 45 s left "
                            "(0 of 4 steps so far)")
    fake.commit(1)
    run.poll()
    assert run.progress is None and run.status().startswith("warm: steps 0–0 (1 of 4 steps so far)")
    fake.close()


def test_a_run_that_has_not_started_is_followed_until_it_appears(tmp_path):
    run = RunState(tmp_path / "later")
    assert run.poll() == [] and not run.exists
    assert "waiting for the run to start" in run.status()
    with pytest.raises(StoreError, match="has not started"):
        run.request_toggle("attention", "native")
    fake = FakeRun(tmp_path / "later", steps=2)
    assert run.poll() == [] and run.exists and run.n_steps == 0
    assert run.paths["attention"] == "strict"
    fake.commit(2)
    assert run.poll() == [0, 1] and run.finished
    assert "(finished)" in run.status()
    fake.close()
    run.close()


def test_following_grows_the_frames_and_bumps_the_revision_only_on_news(fake_run):
    run = RunState(fake_run.run_dir)
    run.poll()
    rev = run.revision
    assert run.poll() == [] and run.revision == rev, "a poll with nothing new changed the state"
    for step in range(3):
        fake_run.commit()
        assert run.poll() == [step]
        assert list(run.steps["step"]) == list(range(step + 1))
        assert run.records["step"].max() == step and len(run.records) == 8 * (step + 1)
        assert run.revision > rev
        rev = run.revision
    run.close()


def test_steps_redone_after_a_resume_replace_their_rows(fake_run):
    fake_run.commit(3)
    run = RunState(fake_run.run_dir)
    run.poll()
    fake_run.store.truncate_after(0)
    fake_run.next = 1
    fake_run.commit(2)
    assert run.poll() == [1, 2]
    assert list(run.steps["step"]) == [0, 1, 2]
    assert len(run.records) == 24 and run.records["record_id"].is_unique
    run.close()


def test_labels_are_short_and_unique(tmp_path):
    labels = run_labels([tmp_path / "a" / "strict", tmp_path / "b" / "strict", tmp_path / "native"])
    assert list(labels) == ["a/strict", "b/strict", "native"]
    assert initial_paths({"path": "native", "ops": {"attention": "strict"}})["attention"] == "strict"
    assert initial_paths({"path": "native", "ops": {}})["linear"] == "native"


def test_drill_down_follows_the_newest_step_until_a_step_is_chosen(fake_run):
    fake_run.commit(2)
    state = state_of(fake_run)
    assert state.step == 1 and state.follow_latest
    fake_run.commit()
    assert state.poll() == {"fake": [2]} and state.step == 2
    state.select_step(1)
    assert state.step == 1 and not state.follow_latest
    fake_run.commit()
    state.poll()
    assert state.step == 1, "choosing a step must stop the following"
    with pytest.raises(KeyError, match="no complete step 9"):
        state.select_step(9)
    state.close()


def test_drill_down_step_sample_token(fake_run):
    fake_run.commit(2)
    state = state_of(fake_run)
    state.select_step(0)
    recs = state.step_records
    assert list(recs["record_id"]) == [r.record_id for r in make_step(0).records]
    # the sample shown first is the one with the most mismatching tokens
    assert state.record_id == recs.loc[recs["mismatch_count"].astype(int).idxmax(), "record_id"]
    assert state.param.record_id.objects == list(recs["record_id"])
    rid = recs["record_id"][3]
    state.record_id = rid
    want = Timeline(fake_run.run_dir).tokens(0, rid)
    got = state.tokens
    assert list(got["token"]) == [labelled_text(t) for t in want["token_id"]]
    np.testing.assert_array_equal(got["rollout_lp"].to_numpy().view(np.uint32),
                                  want["rollout_lp"].to_numpy().view(np.uint32))
    assert list(got["mismatch"]) == list(want["mismatch"])
    # a click on the heatmap: row 5, position 0
    state.select_cell(5, 0)
    assert state.record_id == recs["record_id"][5] and state.position == 0
    state.select_cell(5, 10_000)  # past the record's end: the sample, no token
    assert state.record_id == recs["record_id"][5] and state.position is None
    state.close()


def test_first_divergence_of_the_chosen_step(fake_run):
    fake_run.commit(3)
    state = state_of(fake_run)
    state.select_step(0)
    assert state.first_divergence == make_step(0).summary.first_divergence
    state.select_step(1)
    assert state.first_divergence is None
    located = state.current.first_divergences()
    assert list(located["step"]) == [0, 2] and set(located["op"]) == {"linear"}
    state.close()


def test_heatmap_is_samples_by_positions_with_bitwise_verdicts(fake_run):
    fake_run.commit(1)
    state = state_of(fake_run)
    hm = state.heatmap
    fake = make_step(0)
    lengths = [r.n_tokens for r in fake.records]
    assert hm.shape == (len(fake.records), max(lengths))
    assert hm.record_ids == [r.record_id for r in fake.records]
    for i, (rec, rc) in enumerate(zip(fake.records, fake.recomputes)):
        k = rec.n_tokens
        a, b = rec.logprobs_array(), rc.logprobs_array()
        want = mismatches(a, b)
        assert (hm.mismatch[i, :k] == want).all()
        assert (hm.z[i, :k][~want] == EQUAL_Z).all(), "a bitwise-equal token is not drawn as equal"
        assert (hm.z[i, :k][want] >= MIN_Z).all()
        assert np.isnan(hm.z[i, k:]).all() and (hm.token_ids[i, k:] == -1).all(), "padding must stay empty"
        assert (hm.token_ids[i, :k] == rec.token_ids).all()
        assert hm.labels[i].endswith(f"({int(want.sum())}/{k})")
        assert f"token 'tok{rec.token_ids[0]}'" in hm.hover[i][0]
        # the printed logprobs read back to the same fp32 bits
        lines = hm.hover[i][0].split("<br>")
        shown = {ln.split(" logprob ")[0]: np.float32(ln.split(" logprob ")[1]) for ln in lines if " logprob " in ln}
        assert shown["rollout"].view(np.uint32) == a[0].view(np.uint32)
        assert shown["trainer"].view(np.uint32) == b[0].view(np.uint32)
        assert hm.hover[i][k:] == [""] * (hm.shape[1] - k)
    state.close()


def test_diff_z_separates_equal_bits_from_tiny_and_signed_zero_differences():
    rollout = np.array([-1.0, -0.0, -2.5, -np.inf, -3.0, np.nan], dtype=np.float32)
    trainer = np.array([-1.0, 0.0, np.nextafter(np.float32(-2.5), np.float32(0)), -np.inf, -np.inf, np.nan],
                       dtype=np.float32)
    z, mism, diff = diff_z(rollout, trainer)
    assert list(mism) == [False, True, True, False, True, False]
    assert z[0] == EQUAL_Z and z[3] == EQUAL_Z and z[5] == EQUAL_Z
    assert z[1] == MIN_Z, "-0.0 vs 0.0 differs in its bits: it must not look equal"
    assert z[2] == pytest.approx(np.log10(abs(float(trainer[2]) - float(rollout[2]))))
    assert z[4] == MAX_Z and diff[1] == 0.0


def test_toggle_request_is_written_and_shown_once_the_run_applies_it(fake_run):
    fake_run.commit(1)
    state = state_of(fake_run)
    rid = state.request_toggle("fake", "attention", "native")
    pending = fake_run.store.pending_toggles()
    assert [(r.request_id, r.op, r.path, r.source) for r in pending] == [(rid, "attention", "native", "dashboard")]
    run = state.current
    assert run.pending_path("attention") == "native" and "request #" in state.message
    fake_run.commit()  # the loop's step boundary: applies the request, records a ToggleEvent
    state.poll()
    assert run.pending.empty
    assert list(run.toggles[["step", "op", "path", "source", "request_id"]].itertuples(index=False, name=None)) \
        == [(1, "attention", "native", "dashboard", rid)]
    assert run.paths["attention"] == "native"
    assert list(run.steps["path.attention"]) == ["strict", "native"]
    with pytest.raises(StoreError, match="toggle request refused: unknown op"):
        state.request_toggle("fake", "softmax", "native")
    state.close()


def test_toggle_refused_without_the_token_and_nothing_written(fake_run):
    fake_run.commit(1)
    for presented in (None, "wrong-token-x"):
        state = state_of(fake_run, required_token="the-right-token", session_token=presented)
        assert not state.can_control()
        with pytest.raises(TokenRefused, match="refused"):
            state.request_toggle("fake", "linear", "native")
        state.close()
    assert fake_run.store.pending_toggles() == []
    state = state_of(fake_run, required_token="the-right-token", session_token="the-right-token")
    assert state.can_control()
    state.request_toggle("fake", "linear", "native")
    assert [r.op for r in fake_run.store.pending_toggles()] == ["linear"]
    state.close()


def test_toggle_refused_for_a_finished_run(tmp_path):
    fake = FakeRun(tmp_path / "done", steps=1)
    fake.commit()
    state = state_of(fake)
    with pytest.raises(StoreError, match="finished"):
        state.request_toggle("done", "rope", "native")
    assert "finished" in state.message
    assert fake.store.pending_toggles() == []
    fake.close()
    state.close()


def test_token_and_address_policy():
    for ok in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(ok)
        check_serve_policy(ok, None)
    for other in ("0.0.0.0", "10.1.2.3", "::", "myhost.example"):
        assert not is_loopback(other)
        with pytest.raises(AccessError, match="--token"):
            check_serve_policy(other, None)
        check_serve_policy(other, "long-enough-token")
    with pytest.raises(AccessError, match="at least 8"):
        check_serve_policy("127.0.0.1", "short")
    assert token_matches(None, None) and token_matches(None, "anything")
    assert token_matches("abcdefgh", "abcdefgh")
    assert not token_matches("abcdefgh", None) and not token_matches("abcdefgh", "abcdefgX")
    with pytest.raises(TokenRefused, match="without a token"):
        check_token("abcdefgh", None)
    with pytest.raises(TokenRefused, match="wrong token"):
        check_token("abcdefgh", "nope")
    assert session_token({"token": [b"abc"]}) == "abc" and session_token({}) is None


def test_toggle_requests_reach_the_store_from_a_second_writer(fake_run):
    """The dashboard writes requests while the run holds its own writer connection (as in a live run)."""
    fake_run.commit(1)
    run = RunState(fake_run.run_dir)
    run.poll()
    ids = [run.request_toggle(op, "native") for op in ("rms_norm", "swiglu")]
    with RunStore.open(fake_run.run_dir, readonly=True) as s:
        assert [r.request_id for r in s.pending_toggles()] == ids
    run.close()


def test_replays_the_run_brought_back_from_the_h200(tmp_path):
    """The committed H200 validation store (qwen3-0.6b shape, 16 samples x 512 tokens a step, per-token
    records of every second step) replays like any run; a step without per-token records says why.
    Copied first, so reading it leaves nothing beside the committed file."""
    import shutil

    from tests.conftest import REPO

    src = REPO / "lab" / "runs" / "h200-validation-2026-11-29" / "strict"
    shutil.copytree(src, tmp_path / "strict")
    with RunStore.open(tmp_path / "strict", readonly=True) as store:
        summaries = store.steps()
    state = DashboardState.from_run_dirs([tmp_path / "strict"], token_text=TokenText(labelled_text))
    run = state.current
    assert run.n_steps == len(summaries) > 0 and run.config["preset"] == "qwen3-0.6b"
    assert list(run.steps["mismatch_count"]) == [s.mismatch_count for s in summaries]
    # it opens on a step with per-token data (the most mismatching; all 0 here: the latest such step)
    assert state.step == 198 and summaries[-1].step == 199
    chart = HeatmapChart()
    state.select_step(199)
    assert state.heatmap.shape[0] == 0 and "one step in 2" in state.heatmap.note
    chart.update(state.heatmap, run.label)
    assert chart.fig.layout.xaxis.showticklabels is False  # no position labels over an empty grid
    state.select_step(198)
    hm, kept = state.heatmap, run.records[run.records["step"] == 198]
    assert hm.note == "" and hm.shape == (len(kept), int(kept["n_tokens"].max())) == (16, 512)
    assert int(hm.mismatch.sum()) == summaries[198].mismatch_count == 0
    chart.update(hm, run.label)
    assert chart.fig.layout.xaxis.showticklabels is True and chart.fig.layout.xaxis.dtick is None
    state.close()


def test_a_run_that_ended_early_says_how_from_its_store(tmp_path):
    """Live while its writer holds the lock; afterwards what the run stored (stopped, failed) or, for a
    writer killed outright or a store from before runs said it, that it is not running."""
    stopped = FakeRun(tmp_path / "stopped", steps=6)
    stopped.commit(2)
    run = RunState(stopped.run_dir)
    run.poll()
    assert run.writer_alive and run.status().startswith("stopped: steps 0–1 (2 of 6 steps so far)")
    stopped.end("stopped", "a stop request ended it at a complete step")
    stopped.close()
    run.poll()
    assert not run.writer_alive
    assert "(stopped after 2 of 6 steps: a stop request ended it at a complete step)" in run.status()
    run.close()

    killed = FakeRun(tmp_path / "killed", steps=6)
    killed.commit(1)
    killed.close()  # the lock goes with the process; "running" stays behind
    run = RunState(killed.run_dir)
    run.poll()
    assert "(not running: 1 of 6 steps; its writer (pid" in run.status() and "killed?" in run.status()
    run.close()

    failed = FakeRun(tmp_path / "failed", steps=6)
    failed.commit(3)
    failed.end("failed", "SyncError: checksum not acknowledged by engine-0")
    failed.close()
    run = RunState(failed.run_dir)
    run.poll()
    assert "(failed after 3 of 6 steps: SyncError: checksum not acknowledged by engine-0)" in run.status()
    run.close()


def test_the_committed_h200_stores_read_as_what_they_are(tmp_path):
    """The H200 validation copies under lab/runs (written before runs stored their state): the native
    run that stopped after 6 of 200 steps is not shown as live, and the drill-down opens on a step that
    has per-token data (the strict copy keeps it for every second step: not step 199). Copied first, so
    reading them leaves nothing beside the committed files."""
    import shutil

    for name in ("strict", "native"):
        shutil.copytree(REPO / "lab" / "runs" / "h200-validation-2026-11-29" / name, tmp_path / name)
    state = DashboardState.from_run_dirs([tmp_path / "strict", tmp_path / "native"])
    try:
        native, strict = state.get("native"), state.get("strict")
        assert "(not running: 6 of 200 steps; the store does not say why it stopped)" in native.status()
        assert "so far" not in native.status() and "(finished)" in strict.status()
        assert state.run == "strict" and state.step == strict.default_step() == 198
        assert len(state.step_records) > 0, "the drill-down opened on a step without per-token data"
        state.run = "native"
        assert state.step == native.default_step() and len(state.step_records) > 0
    finally:
        for r in state.runs:
            r.close()
