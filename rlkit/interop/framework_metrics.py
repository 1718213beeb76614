"""The frameworks' own train-vs-rollout metrics, under their own names, computed from imported records.

So a user can hold rlkit's numbers against the logs they already have: an import stores, per step, the
metrics its framework logs for the same comparison (definitions read from the framework's source at the
versions named in rlkit/interop/frameworks.py):

- verl (verl/utils/debug/metrics.py, verl/trainer/ppo/rollout_corr_helper.py `compute_offpolicy_metrics`):
  `training/rollout_probs_diff_{max,mean,std}` are over *probabilities*, |exp(actor) - exp(rollout)| per
  token (std with Bessel's correction, as torch.std), `training/rollout_actor_probs_pearson_corr` the
  Pearson correlation of those probabilities; `rollout_corr/kl` = mean(rollout - actor),
  `rollout_corr/k3_kl` = mean(exp(d) - d - 1) with d = actor - rollout, per-sequence perplexities
  (`training_ppl`, `rollout_ppl`, their logs, `log_ppl_diff*`, `ppl_ratio`), `chi2_token` =
  mean(exp(clip(d, +-20))^2) - 1 and `chi2_seq` = mean over sequences of exp(2 clip(sum d, +-20)) - 1.
- slime (slime/backends/megatron_utils/loss.py): `train/train_rollout_logprob_abs_diff` = the mean over
  samples of each sample's mean |train - rollout| over its loss-masked response tokens (slime's default
  per-sample-mean reduction).

Computed here in fp64 over the stored fp32 logprobs; the frameworks reduce in fp32 on their GPUs, so expect
agreement to a few fp32 ulps, not bit for bit. Only records with trainer logprobs take part.
"""

from __future__ import annotations

import numpy as np

from rlkit.interop.schema import ExchangeRow

SAFETY_BOUND = 20.0
"""verl's clamp of log-ratios before exponentiating (rollout_corr_helper.SAFETY_BOUND)."""


def _pairs(rows: list[ExchangeRow]) -> list[tuple[ExchangeRow, np.ndarray, np.ndarray]]:
    return [(r, np.asarray(r.rollout_logprobs, np.float64), np.asarray(r.trainer_logprobs, np.float64))
            for r in rows if r.trainer_logprobs is not None and r.response_token_ids]


def verl_metrics(rows: list[ExchangeRow]) -> dict[str, float]:
    pairs = _pairs(rows)
    if not pairs:
        return {}
    rollout = np.concatenate([p[1] for p in pairs])
    actor = np.concatenate([p[2] for p in pairs])
    with np.errstate(all="ignore"):
        p_actor, p_rollout = np.exp(actor), np.exp(rollout)
        diff = np.abs(p_actor - p_rollout)
        corr = float(np.corrcoef(p_actor, p_rollout)[0, 1]) if diff.size > 1 else float("nan")
        d = actor - rollout
        seq_actor = np.array([p[2].mean() for p in pairs])
        seq_rollout = np.array([p[1].mean() for p in pairs])
        log_ppl_diff = seq_rollout - seq_actor
        seq_d = np.array([(p[2] - p[1]).sum() for p in pairs])
        out = {
            "training/rollout_probs_diff_valid": 1.0,
            "training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_probs_diff_mean": float(diff.mean()),
            "training/rollout_probs_diff_std": float(diff.std(ddof=1)) if diff.size > 1 else float("nan"),
            "training/rollout_actor_probs_pearson_corr": corr,
            "rollout_corr/kl": float((rollout - actor).mean()),
            "rollout_corr/k3_kl": float((np.exp(d) - d - 1).mean()),
            "rollout_corr/training_ppl": float(np.exp(-seq_actor).mean()),
            "rollout_corr/training_log_ppl": float((-seq_actor).mean()),
            "rollout_corr/rollout_ppl": float(np.exp(-seq_rollout).mean()),
            "rollout_corr/rollout_log_ppl": float((-seq_rollout).mean()),
            "rollout_corr/log_ppl_diff": float(log_ppl_diff.mean()),
            "rollout_corr/log_ppl_abs_diff": float(np.abs(log_ppl_diff).mean()),
            "rollout_corr/log_ppl_diff_max": float(log_ppl_diff.max()),
            "rollout_corr/log_ppl_diff_min": float(log_ppl_diff.min()),
            "rollout_corr/ppl_ratio": float(np.exp(log_ppl_diff).mean()),
            "rollout_corr/chi2_token": float(np.square(np.exp(np.clip(d, -SAFETY_BOUND, SAFETY_BOUND))).mean() - 1),
            "rollout_corr/chi2_seq": float(np.exp(2 * np.clip(seq_d, -SAFETY_BOUND, SAFETY_BOUND)).mean() - 1),
        }
    return out


def slime_metrics(rows: list[ExchangeRow], loss_masks: dict[str, list[int]]) -> dict[str, float]:
    means = []
    for r, rollout, trainer in _pairs(rows):
        mask = np.asarray(loss_masks.get(r.sample_id, [1] * len(rollout)), dtype=bool)
        if mask.shape != rollout.shape or not mask.any():
            continue
        means.append(np.abs(trainer - rollout)[mask].mean())
    return {"train/train_rollout_logprob_abs_diff": float(np.mean(means))} if means else {}


def framework_metrics(fmt: str, rows: list[ExchangeRow], loss_masks: dict[str, list[int]]) -> dict[str, float]:
    """The metrics `fmt` logs for one step's rows ({} for rlkit's own schema: rlkit's metrics are the
    step summary's)."""
    if fmt == "verl":
        return verl_metrics(rows)
    if fmt == "slime":
        return slime_metrics(rows, loss_masks)
    return {}
