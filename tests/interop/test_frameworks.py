"""slime's and verl's dump layouts, written by the tests (tests/interop/dumps.py) with known values, import
into a run store whose records, recomputes, divergence metrics and framework metrics are the known ones.

Expected numbers are computed here from the fixture's own values with plain Python (math.fsum, math.exp),
not with the importer's code: per-token values must come back bit for bit (`torch.equal`), rlkit's
divergence exactly (the diffs are exact binary fractions), the frameworks' metrics to fp64 rounding.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlkit.cli import main
from rlkit.interop import import_run
from rlkit.timeline import Timeline
from rlkit.timeline.store import RunStore
from tests.interop.dumps import DELTA, write_slime, write_verl


def _check_records(store: RunStore, known) -> None:
    by_id = {k.sample_id: k for k in known}
    seen = 0
    for s in store.steps():
        recomputes = {c.record_id: c for c in store.recomputes(s.step)}
        for r in store.records(s.step):
            k = by_id[r.record_id]
            assert (r.step, r.prompt_ids, r.token_ids) == (k.step, k.prompt_ids, k.tokens)
            assert torch.equal(torch.tensor(r.rollout_logprobs, dtype=torch.float32),
                               torch.tensor(k.rollout, dtype=torch.float32))
            assert r.reward == k.reward
            if k.trainer is None:
                assert r.record_id not in recomputes
            else:
                assert torch.equal(torch.tensor(recomputes[r.record_id].trainer_logprobs, dtype=torch.float32),
                                   torch.tensor(k.trainer, dtype=torch.float32))
            seen += 1
    assert seen == len(known)


def _expected_divergence(known, step):
    rows = [k for k in known if k.step == step]
    diffs = [t - r for k in rows for r, t in zip(k.rollout, k.trainer)]
    return len(diffs), sum(d != 0 for d in diffs), max(abs(d) for d in diffs), math.fsum(map(abs, diffs)) / len(diffs)


def test_slime_dump_imports_with_known_values(tmp_path, capsys):
    known = write_slime(tmp_path / "dump")
    assert main(["import", "slime", str(tmp_path / "dump"), "--run-dir", str(tmp_path / "run")]) == 0
    assert "imported 8 records of 2 steps from slime" in capsys.readouterr().err
    with RunStore.open(tmp_path / "run", readonly=True) as store:
        _check_records(store, known)
        steps = store.steps()
        assert [s.step for s in steps] == [0, 1]
        for s in steps:
            n, mismatched, max_diff, mean_diff = _expected_divergence(known, s.step)
            assert (s.compared_tokens, s.mismatch_count, s.max_abs_diff, s.mean_abs_diff) == \
                   (n, mismatched, DELTA, mean_diff)
            assert s.weight_version == s.step  # slime recorded weight_versions ["<rollout_id>"]
            assert s.reward_mean == 0.5
        records = store.records(0)
        assert [r.finish_reason for r in records] == ["stop", "stop", "stop", "length"]
        assert [(r.prompt_id, r.sample_index) for r in records] == [
            ("slime/0/group0", 0), ("slime/0/group0", 1), ("slime/0/group1", 0), ("slime/0/group1", 1)]
    with Timeline(tmp_path / "run") as tl:
        source = tl.source()
        assert source["format"] == "slime" and "weight versions" not in source["not_recorded"]
        assert "sampling parameters" in source["not_recorded"]
        metrics = tl.framework_metrics().set_index("step")
    for step in (0, 1):  # slime: mean over samples of the mean |train - rollout| over loss-masked tokens
        per_sample = [math.fsum(abs(t - r) for r, t, m in zip(k.rollout, k.trainer, k.loss_mask) if m)
                      / sum(k.loss_mask) for k in known if k.step == step]
        expected = math.fsum(per_sample) / len(per_sample)
        assert metrics.loc[step, "train/train_rollout_logprob_abs_diff"] == pytest.approx(expected, rel=1e-12)


def test_slime_rollout_dump_alone_says_trainer_logprobs_are_not_recorded(tmp_path):
    known = write_slime(tmp_path / "dump", with_train=False)
    with import_run("slime", tmp_path / "dump", tmp_path / "run") as store:
        _check_records(store, known)
        for s in store.steps():
            assert s.compared_tokens == 0 and math.isnan(s.max_abs_diff)  # nothing compared: no number
        source = store.info("import")
    assert source["not_recorded"][0] == "trainer logprobs of step(s) 0, 1 (no train_data dump)"
    assert source["metrics"] == {}


def test_verl_dump_imports_with_known_values(tmp_path):
    known = write_verl(tmp_path / "dump")
    with import_run("verl", tmp_path / "dump", tmp_path / "run", semantics="processed") as store:
        _check_records(store, known)  # the padding (response_mask 0) is gone
        steps = store.steps()
        assert [s.step for s in steps] == [1, 2]
        for s in steps:
            n, mismatched, max_diff, _ = _expected_divergence(known, s.step)
            assert (s.compared_tokens, s.mismatch_count, s.max_abs_diff) == (n, mismatched, DELTA)
        source = store.info("import")
    assert source["logprob_semantics"] == "processed" and source["semantics_given"]
    assert source["not_recorded"][0] == "weight versions"
    assert source["weight_versions"].startswith("stand-ins")
    for step in (1, 2):
        rows = [k for k in known if k.step == step]
        m = source["metrics"][str(step)]
        p_diff = [abs(math.exp(t) - math.exp(r)) for k in rows for r, t in zip(k.rollout, k.trainer)]
        mean = math.fsum(p_diff) / len(p_diff)
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in p_diff) / (len(p_diff) - 1))
        d = [t - r for k in rows for r, t in zip(k.rollout, k.trainer)]
        assert m["training/rollout_probs_diff_max"] == pytest.approx(max(p_diff), rel=1e-12)
        assert m["training/rollout_probs_diff_mean"] == pytest.approx(mean, rel=1e-12)
        assert m["training/rollout_probs_diff_std"] == pytest.approx(std, rel=1e-9)
        assert m["rollout_corr/kl"] == pytest.approx(-math.fsum(d) / len(d), rel=1e-12)
        assert m["rollout_corr/k3_kl"] == pytest.approx(math.fsum(math.exp(x) - x - 1 for x in d) / len(d),
                                                        rel=1e-6)
        assert m["rollout_corr/chi2_token"] == pytest.approx(math.fsum(math.exp(2 * x) for x in d) / len(d) - 1,
                                                             rel=1e-9)
        seq = [math.fsum(t - r for r, t in zip(k.rollout, k.trainer)) for k in rows]
        assert m["rollout_corr/chi2_seq"] == pytest.approx(math.fsum(math.exp(2 * x) for x in seq) / len(seq) - 1,
                                                           rel=1e-9)
        assert -1.0 <= m["training/rollout_actor_probs_pearson_corr"] <= 1.0


def test_report_and_dashboard_state_open_an_imported_run(tmp_path, capsys):
    write_slime(tmp_path / "dump")
    import_run("slime", tmp_path / "dump", tmp_path / "run").close()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("imported from slime") and "not recorded:" in out[0]
    assert out[4] == "slime's own metrics, from the same records (docs/IMPORT.md):"
    assert out[5].startswith("  step 0: train/train_rollout_logprob_abs_diff=")
    assert len(out) == 7  # the origin line, the header, two steps, slime's metrics of both
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert set(rows[1]["framework_metrics"]) == {"train/train_rollout_logprob_abs_diff"}
    assert main(["report", str(tmp_path / "run"), "--check"]) == 0

    from rlkit.dashboards.state import DashboardState

    state = DashboardState.from_run_dirs([tmp_path / "run"], token_text=lambda i: f"t{i}")
    try:
        run = state.current
        assert "imported from slime; not recorded: sampling parameters" in run.status()
        assert run.finished and run.status().startswith("run: steps 0–1 (finished)")
        state.select_step(1)
        assert state.heatmap.shape == (4, 6) and int(state.heatmap.mismatch.sum()) == 6
        assert len(state.tokens) == state.step_records.set_index("record_id").loc[state.record_id, "n_tokens"]
    finally:
        state.close()


def test_slime_samples_without_a_train_sample_keep_their_rollout_side(tmp_path):
    """slime trains on fewer samples than it rolled out when some are removed (Sample.remove_sample, a
    filter); the train dump links the rest by rollout_position."""
    known = write_slime(tmp_path / "dump", rollouts=(0,))
    path = tmp_path / "dump" / "train_data" / "0.pt"
    payload = torch.load(path, weights_only=True)
    del payload["samples"][1]
    torch.save(payload, path)
    known[1].trainer = None
    with import_run("slime", tmp_path / "dump", tmp_path / "run") as store:
        _check_records(store, known)
        assert len(store.recomputes(0)) == 3
        source = store.info("import")
    assert source["notes"] == ["1 rollout sample(s) have no train sample (not trained on): rollout side only"]
