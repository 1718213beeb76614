"""GRPO/DAPO policy loss: group-normalized advantages, clip-higher ratio clipping, token-level mean.

The importance ratio is exp(trainer logprob - rollout logprob): the rollout's recorded logprob is the
"old" policy. Under the strict contract, at the first update of a batch the two are equal bit for bit,
the ratio is exactly 1 and clipping never fires because of numerics; under the native path it does,
and `clip_fraction` shows how often.

    advantages = group_advantages(rewards, group_size=8)
    loss, stats = policy_loss(new_lp, rollout_lp, token_advantages, mask)
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """rewards [n] laid out group by group (n = groups * group_size) -> advantages [n]:
    (r - group mean) / (group std + eps) (GRPO); without std normalization when normalize_std=False."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.double().view(-1, group_size)
    adv = r - r.mean(-1, keepdim=True)
    if normalize_std:
        adv = adv / (r.std(-1, unbiased=False, keepdim=True) + eps)
    return adv.reshape(-1).float()


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor | None = None, clip_low: float = 0.2, clip_high: float = 0.28,
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                normalizer: torch.Tensor | None = None):
    """Clipped surrogate over tokens (all [N]); returns (loss, stats). normalizer: N_tokens of the whole
    batch when these tokens are one micro-batch of it (the micro-batches' losses then add up to the
    batch's); None: these tokens' own count.

    loss = -sum_t min(ratio_t * A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_t) / N_tokens
           + kl_coef * mean_t K3(ref || new)
    The token-level mean (DAPO) weighs every token equally whatever its sequence's length.
    """
    if mask is None:
        mask = torch.ones_like(logprobs, dtype=torch.bool)
    mask = mask.bool()
    n = mask.sum().clamp_min(1) if normalizer is None else normalizer.to(logprobs.device)
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    loss = -(surrogate * mask).sum() / n
    kl = torch.zeros((), device=logprobs.device)
    if ref_logprobs is not None and kl_coef:
        d = ref_logprobs.detach() - logprobs
        kl = ((torch.exp(d) - 1 - d) * mask).sum() / n
        loss = loss + kl_coef * kl
    with torch.no_grad():
        fired = ((ratio * advantages) > (clipped * advantages)) & mask
        stats = {
            "clip_fraction": float(fired.sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
            "kl_ref": float(kl),
        }
    return loss, stats
