"""The notebook view: DataFrames of steps, versions, syncs, records (with per-record mismatch) and tokens."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rlkit.bitwise import differs
from rlkit.divergence import logprob_divergence
from rlkit.timeline import RunStore, StoreError, SyncEvent, Timeline, ToggleEvent
from rlkit.timeline.timeline import mismatches
from tests.timeline.fakes import initial, make_step


@pytest.fixture
def run_dir(tmp_path):
    store = RunStore.create(tmp_path / "run", {"task": "arith"})
    store.commit_initial(*initial())
    for step in range(3):
        s = make_step(step)
        toggles = [ToggleEvent(2, "attention", "native", 5.0, 6.0, "dashboard", "fp2")] if step == 2 else []
        syncs = s.syncs + ([SyncEvent("engine-1", 3, "aa", "ab", 1.0, 1.5)] if step == 2 else [])
        # the last record of step 2 has no recompute (e.g. filtered out of the update)
        recomputes = s.recomputes[:-1] if step == 2 else s.recomputes
        store.commit_step(s.summary, s.records, recomputes, s.versions, syncs, toggles)
    store.close()
    return tmp_path / "run"


def test_the_mismatch_rule_is_rlkit_bitwise():
    a = np.array([0.0, -0.0, np.nan, np.nan, np.inf, -np.inf, 1.0, 1.0], dtype=np.float32)
    b = np.array([-0.0, -0.0, np.nan, 1.0, np.inf, np.inf, np.nextafter(np.float32(1), np.float32(2)), 1.0],
                 dtype=np.float32)
    expected = differs(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert mismatches(a, b).tolist() == expected.tolist() == [True, False, False, True, False, True, True, False]


def test_empty_run_has_the_columns(tmp_path):
    RunStore.create(tmp_path / "empty", {}).close()
    tl = Timeline(tmp_path / "empty")
    assert "no steps yet" in repr(tl)
    assert {"step", "mismatch_count", "reward_mean", "valid"} <= set(tl.steps().columns)
    assert tl.records().empty and "mismatch_count" in tl.records().columns
    assert tl.versions().empty and list(tl.toggles().columns)[:3] == ["step", "op", "path"]


def test_steps_versions_syncs_toggles(run_dir):
    tl = Timeline(run_dir)
    assert repr(tl) == f"Timeline({str(run_dir)!r}: steps 0..2, 24 records, 4 weight versions, 1 toggles)"
    steps = tl.steps()
    assert steps["step"].tolist() == [0, 1, 2]
    assert steps["mismatch_count"].tolist() == [make_step(s).summary.mismatch_count for s in range(3)]
    assert steps["path.attention"].tolist() == ["strict"] * 3 and steps["time.update"].tolist() == [0.0, 1.0, 2.0]
    assert tl.versions()["version"].tolist() == [0, 1, 2, 3]
    syncs = tl.syncs()
    assert len(syncs) == 9 and syncs["ok"].tolist() == [True] * 8 + [False]
    assert tl.toggles()[["step", "op", "path", "source"]].values.tolist() == [[2, "attention", "native", "dashboard"]]
    assert tl.config() == {"task": "arith"}


def test_records_carry_the_mismatch_against_their_recompute(run_dir):
    tl = Timeline(run_dir)
    assert len(tl.records()) == 24
    df = tl.records(step=1)
    want = make_step(1)
    assert df["record_id"].tolist() == [r.record_id for r in want.records]
    assert df["n_tokens"].tolist() == [r.n_tokens for r in want.records]
    expected = [logprob_divergence(torch.tensor(r.rollout_logprobs), torch.tensor(c.trainer_logprobs))
                for r, c in zip(want.records, want.recomputes)]
    assert df["mismatch_count"].tolist() == [e.mismatch_count for e in expected]
    assert df["mismatch_count"].sum() > 0, "the fake run has mismatches, so this comparison can fail"
    assert np.allclose(df["max_abs_diff"], [e.max_abs_diff for e in expected])
    last = tl.records(step=2).iloc[-1]
    assert last["mismatch_count"] is pd.NA and last["recompute_version"] is pd.NA


def test_tokens_of_one_record(run_dir):
    tl = Timeline(run_dir)
    want = make_step(1)
    rec, rc = want.records[3], want.recomputes[3]
    df = tl.tokens(1, rec.record_id)
    assert list(df.columns) == ["position", "token_id", "rollout_lp", "trainer_lp", "diff", "mismatch"]
    assert df["token_id"].tolist() == rec.token_ids
    assert (df["rollout_lp"].to_numpy().view(np.uint32) == rec.logprobs_array().view(np.uint32)).all()
    assert (df["trainer_lp"].to_numpy().view(np.uint32) == rc.logprobs_array().view(np.uint32)).all()
    assert df["mismatch"].sum() == differs(torch.tensor(rec.rollout_logprobs), torch.tensor(rc.trainer_logprobs)).sum()
    no_recompute = tl.tokens(2, make_step(2).records[-1].record_id)
    assert no_recompute["trainer_lp"].isna().all() and not no_recompute["mismatch"].any()
    with pytest.raises(StoreError, match="belongs to step 1, not step 0"):
        tl.tokens(0, rec.record_id)
    with pytest.raises(StoreError, match="no record 'nope'"):
        tl.tokens(0, "nope")
