"""The GRPO/DAPO loss (rlkit/train/grpo.py) on cases computed by hand.

Policy loss, 4 tokens, the last one masked out; clip_low 0.2, clip_high 0.28 (DAPO's clip-higher):
    new logprob  [-1.0, -1.0, -2.0, -0.5]      old (rollout) [-1.0, -1.5, -1.0, -0.5]
    advantage    [ 1.0,  1.0, -1.0,  2.0]      mask          [1, 1, 1, 0]
    ratio = exp(new - old) = [1, e^0.5 = 1.649, e^-1 = 0.368, 1]; clipped to [0.8, 1.28]: [1, 1.28, 0.8, 1]
    surrogate = min(ratio * A, clipped * A) = [1, 1.28, -0.8, (2, masked)]
    loss = -(1 + 1.28 - 0.8) / 3 = -1.48 / 3;  clip_fraction 2/3 (tokens 1 and 2: the min took the clip)
    d loss / d new = [-1/3, 0, 0, 0]: a clipped token passes no gradient, a masked one neither.
"""

import math

import pytest
import torch

from rlkit.train.grpo import group_advantages, policy_loss

NEW = [-1.0, -1.0, -2.0, -0.5]
OLD = [-1.0, -1.5, -1.0, -0.5]
ADV = [1.0, 1.0, -1.0, 2.0]
MASK = [True, True, True, False]


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    eps = 1e-6
    # group 1: mean 0.5, population std 0.5; group 2: mean 0.25, std sqrt(0.1875); group 3: all equal -> 0
    s2 = math.sqrt(0.1875)
    expected = [0.5 / (0.5 + eps), -0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0.5 / (0.5 + eps),
                -0.25 / (s2 + eps), -0.25 / (s2 + eps), -0.25 / (s2 + eps), 0.75 / (s2 + eps), 0.0, 0.0, 0.0, 0.0]
    adv = group_advantages(rewards, 4)
    assert adv.dtype == torch.float32
    assert torch.equal(adv, torch.tensor(expected, dtype=torch.float64).float())  # fp64 math, one rounding
    centred = group_advantages(rewards, 4, normalize_std=False)
    assert centred.tolist() == [0.5, -0.5, -0.5, 0.5, -0.25, -0.25, -0.25, 0.75, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="12 rewards do not split into groups of 5"):
        group_advantages(rewards, 5)


def test_policy_loss_by_hand():
    new = torch.tensor(NEW, requires_grad=True)
    loss, stats = policy_loss(new, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK))
    assert loss.item() == pytest.approx(-1.48 / 3, rel=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 3, rel=1e-6)
    assert stats["ratio_mean"] == pytest.approx((1 + math.exp(0.5) + math.exp(-1)) / 3, rel=1e-6)
    assert stats["kl_ref"] == 0.0
    loss.backward()
    assert new.grad.tolist() == pytest.approx([-1 / 3, 0.0, 0.0, 0.0], abs=1e-7)


def test_ratio_one_is_the_policy_gradient():
    """On-policy (the strict contract's case: recompute == rollout bit for bit) the ratio is exactly 1,
    nothing clips, and the gradient is -A / N on every unmasked token."""
    lp = torch.tensor(NEW, requires_grad=True)
    loss, stats = policy_loss(lp, lp.detach().clone(), torch.tensor(ADV), torch.tensor(MASK))
    assert loss.item() == pytest.approx(-(1.0 + 1.0 - 1.0) / 3, rel=1e-7)
    assert (stats["clip_fraction"], stats["ratio_mean"]) == (0.0, 1.0)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-1 / 3, -1 / 3, 1 / 3, 0.0], abs=1e-7)


def test_kl_term_by_hand():
    # ref [-1]*4: d = ref - new = [0, 0, 1, -0.5]; K3 = e^d - 1 - d = [0, 0, e - 2, (e^-0.5 - 0.5), masked]
    new = torch.tensor(NEW)
    base, _ = policy_loss(new, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK))
    loss, stats = policy_loss(new, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK),
                              ref_logprobs=torch.full((4,), -1.0), kl_coef=0.1)
    kl = (math.e - 2) / 3
    assert stats["kl_ref"] == pytest.approx(kl, rel=1e-6)
    assert loss.item() == pytest.approx(base.item() + 0.1 * kl, rel=1e-6)


def test_token_level_mean_weighs_tokens_not_sequences():
    """DAPO's token-level mean: a 1-token sequence with A = +1 and a 3-token one with A = -1 give
    -(1 - 3) / 4 = 0.5 at ratio 1 (a per-sequence mean would give 0)."""
    lp = torch.zeros(4)
    loss, _ = policy_loss(lp, lp.clone(), torch.tensor([1.0, -1.0, -1.0, -1.0]))
    assert loss.item() == 0.5


def test_an_all_masked_batch_has_zero_loss():
    lp = torch.tensor(NEW)
    loss, stats = policy_loss(lp, torch.tensor(OLD), torch.tensor(ADV), torch.zeros(4, dtype=torch.bool))
    assert loss.item() == 0.0 and stats["clip_fraction"] == 0.0
