"""The held-out rise against the run's own noise (rlkit.heldout.heldout_rise), on hand-made summaries. Issue
17's criteria on the H200 learning arms get their test with the arms' committed stores."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlkit.heldout import heldout_rise


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
