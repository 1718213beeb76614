"""The held-out rise against the run's own noise (rlkit.heldout.heldout_rise), on hand-made summaries and on
the committed H200 learning arms (issue 17's criteria for the strict arm; the native arm beside it: the same
start, seeds and prompts, its kernels' mismatch at every step)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlkit.heldout import heldout_rise
from rlkit.timeline import RunStore
from tests.conftest import REPO

LEARNING = REPO / "lab" / "runs" / "h200-learning-2026-12-03"


def summaries(rewards: dict[int, float], n_steps: int):
    return [SimpleNamespace(step=i, heldout_reward=rewards.get(i)) for i in range(n_steps)]


def test_the_rise_is_the_last_evaluations_mean_over_the_first_and_the_noise_their_changes_spread():
    rise = heldout_rise(summaries({0: 0.5, 10: 0.6, 20: 0.8, 30: 0.7, 40: 0.9}, 45), tail=2, n_prompts=100)
    assert rise.steps == (0, 10, 20, 30, 40) and rise.start == 0.5
    assert rise.end == pytest.approx(0.8) and rise.rise == pytest.approx(0.3)
    changes = [0.1, 0.2, -0.1, 0.2]  # sample standard deviation of the evaluation-to-evaluation changes
    mean = sum(changes) / 4
    assert rise.noise == pytest.approx((sum((c - mean) ** 2 for c in changes) / 3) ** 0.5)
    assert rise.sampling_se == pytest.approx((0.25 / 100) ** 0.5)
    assert "a rise of +0.300" in rise.summary() and "binomial s.e. at the start 0.050" in rise.summary()


def test_too_few_evaluations_or_a_bad_tail_is_a_clear_error():
    with pytest.raises(ValueError, match="3 held-out evaluations; .* needs at least 7"):
        heldout_rise(summaries({0: 0.1, 5: 0.2, 9: 0.3}, 10))
    with pytest.raises(ValueError, match="tail must be at least 1"):
        heldout_rise(summaries({0: 0.1}, 1), tail=0)


def test_the_h200_strict_arm_rises_past_its_noise_with_no_mismatch():
    """Issue 17's criteria on the committed store: 300 steps of the strict path, 0 mismatching tokens over
    >= 10 M compared, and the held-out reward's rise larger than its evaluation-to-evaluation noise."""
    with RunStore.open(LEARNING / "strict", readonly=True) as store:
        steps, cfg, versions = store.steps(), store.config(), store.versions()
    assert (cfg["path"], cfg["runner"]) == ("strict", "ray"), (cfg.get("path"), cfg.get("runner"))
    assert versions[0].checksum == "d05deb5a0593950e", versions[0]  # the warm start's weights
    compared = sum(s.compared_tokens for s in steps)
    mismatches = [(s.step, s.mismatch_count, s.max_abs_diff) for s in steps if s.mismatch_count]
    assert [s.step for s in steps] == list(range(300)), f"{len(steps)} steps stored"
    assert not mismatches and compared >= 10_000_000, (mismatches[:5], compared)
    rise = heldout_rise(steps, n_prompts=cfg["heldout_prompts"])
    print(rise.summary())
    assert rise.start == pytest.approx(0.5390625), rise.summary()  # the warm start's held-out reward
    assert rise.rise > rise.noise > 0, rise.summary()


def test_the_h200_native_arm_is_the_strict_arm_but_for_its_kernels_and_mismatches_at_every_step():
    """The control: the native arm's config is the strict arm's but for `path`, it starts from the same weights
    and held-out reward, its steps draw the same prompts, and every step ran the native kernels and
    mismatched; its K3 KL stayed small over the 300 steps (no blow-up of the rollout-correction KL)."""
    with RunStore.open(LEARNING / "strict", readonly=True) as store:
        strict_cfg, strict_prompts = store.config(), [sorted(r.prompt_id for r in store.records(s)) for s in (0, 288)]
    with RunStore.open(LEARNING / "native", readonly=True) as store:
        steps, cfg, versions = store.steps(), store.config(), store.versions()
        prompts = [sorted(r.prompt_id for r in store.records(s)) for s in (0, 288)]
    differs = {k: (strict_cfg.get(k), cfg.get(k)) for k in set(cfg) | set(strict_cfg) if cfg.get(k) != strict_cfg.get(k)}
    assert differs == {"path": ("strict", "native")}, differs
    assert versions[0].checksum == "d05deb5a0593950e", versions[0]
    assert [s.step for s in steps] == list(range(300)), f"{len(steps)} steps stored"
    assert prompts == strict_prompts and len(prompts[0]) == 256, "the arms drew other prompts"
    not_native = [(s.step, s.ops_paths) for s in steps if set(s.ops_paths.values()) != {"native"}]
    assert not not_native, not_native[:3]
    exact = [s.step for s in steps if not s.mismatch_count]
    assert not exact, f"steps with no mismatching token: {exact[:10]}"
    assert sum(s.compared_tokens for s in steps) >= 10_000_000
    assert heldout_rise(steps, n_prompts=cfg["heldout_prompts"]).start == pytest.approx(0.5390625)
    worst = max(steps, key=lambda s: s.k3_kl)
    print(f"native K3 KL: largest {worst.k3_kl:.3g} at step {worst.step}")
    assert 0 < worst.k3_kl < 1e-4, (worst.step, worst.k3_kl)
