"""The embedded trainer: strict recompute with autograd, the GRPO/DAPO loss, AdamW on fp32 masters.

One `train_step` does what an RL update needs from the trainer side:
1. recompute the logprobs of every response token under the trainer's contract (packed, with the
   autograd graph kept); their detached values are the "trainer logprobs" the divergence compares with
   the rollout's — the same numbers the loss sees, not a second forward;
2. the clipped surrogate with the rollout's logprobs as the old policy (rlkit.train.grpo);
3. backward, gradient clipping, AdamW on fp32 master weights, and the model's (bf16) weights
   rounded from the masters: a bf16 model cannot accumulate small updates on its own.

The model's weights after the step are what `state_dict()` publishes as the next version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlkit import ops
from rlkit.contract import NumericsContract
from rlkit.types import SamplingParams
from rlkit.model.checkpoint import weights_checksum
from rlkit.model.qwen3 import Qwen3ForCausalLM
from rlkit.train.grpo import policy_loss
from rlkit.train.recompute import response_logprobs


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    max_batch_tokens: int = 4096
    """Tokens per packed forward (longest-first greedy packing, rlkit.train.recompute.pack_order)."""
    micro_batch_tokens: int | None = None
    """Gradient accumulation: the batch's sequences, in order, in groups of at most this many tokens
    (prompt + response; a longer sequence is a group of its own), each group's forward and backward done
    before the next starts, so one group's activations are alive at a time, as a trainer's micro-batches
    do. None: the whole batch in one backward. The trainer logprobs do not depend on it (every strict op is
    batch-invariant); the gradient's sum over groups is another order of additions, so the updated
    weights' bits do."""

    def __post_init__(self) -> None:
        if self.micro_batch_tokens is not None and (not isinstance(self.micro_batch_tokens, int)
                                                    or self.micro_batch_tokens < 1):
            raise ValueError(f"micro_batch_tokens={self.micro_batch_tokens!r}: a positive token count or None")


@dataclass
class TrainBatch:
    """One update's data, per sequence; every trainer (embedded, Megatron) takes this."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    rollout_logprobs: list[torch.Tensor]
    """The rollout's recorded logprobs, [len - prompt_len] fp32 each (the ratio's denominator)."""
    advantages: list
    """One float per sequence (GRPO's group-normalized reward), or a [len - prompt_len] tensor each."""
    params: SamplingParams | None = None
    """Processed semantics (temperature / top-k / top-p) when sampling was not the identity."""
    loss_mask: list[torch.Tensor] | None = None
    """1 where a response token counts in the loss (None: every response token)."""

    def token_advantages(self, lengths: list[int]) -> torch.Tensor:
        return torch.cat([a.float().reshape(-1) if isinstance(a, torch.Tensor)
                          else torch.full((n,), float(a), dtype=torch.float32)
                          for n, a in zip(lengths, self.advantages)])

    def token_mask(self) -> torch.Tensor | None:
        return None if self.loss_mask is None else torch.cat([m.bool().reshape(-1) for m in self.loss_mask])

    def subset(self, rows: list[int]) -> "TrainBatch":
        """The sequences `rows` (in that order) as a batch of their own."""
        pick = lambda xs: None if xs is None else [xs[i] for i in rows]  # noqa: E731
        return TrainBatch(pick(self.sequences), pick(self.prompt_lens), pick(self.rollout_logprobs),
                          pick(self.advantages), self.params, pick(self.loss_mask))


def micro_batches(lengths: list[int], budget: int | None) -> list[list[int]]:
    """Consecutive groups of sequence indices, each at most `budget` tokens (one sequence alone if it is
    longer); one group of everything when budget is None."""
    if budget is None:
        return [list(range(len(lengths)))]
    groups: list[list[int]] = []
    used = budget + 1
    for i, n in enumerate(lengths):
        if used + n > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


class EmbeddedTrainer:
    def __init__(self, model: Qwen3ForCausalLM, contract: NumericsContract, optim: OptimConfig | None = None,
                 reference: Qwen3ForCausalLM | None = None):
        self.model = model
        self.contract = contract
        self.optim_config = optim or OptimConfig()
        self.reference = reference
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
        o = self.optim_config
        # fused: one pass per parameter instead of one per AdamW op (4x faster on the CPU for the tiny
        # model's 19.4 M-entry tied embedding); deterministic, and the checkpoint's state is the same format
        self.optimizer = torch.optim.AdamW(self.masters, lr=o.lr, betas=o.betas, eps=o.adam_eps,
                                           weight_decay=o.weight_decay, fused=True)

    def set_contract(self, contract: NumericsContract) -> None:
        self.contract = contract

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def checksum(self) -> str:
        return weights_checksum(self.model.state_dict())

    def _forward_loss(self, batch: TrainBatch, normalizer: torch.Tensor | None = None):
        """Recompute `batch`'s logprobs with autograd and its loss: (per-sequence logprobs, the reference's
        logprobs or None, loss, stats). normalizer: the token count the loss divides by (a micro-batch's
        share of the whole batch's mean); None: its own."""
        o = self.optim_config
        params = [batch.params] * len(batch.sequences) if batch.params is not None else None
        with ops.use_contract(self.contract):
            new_lp = response_logprobs(self.model, batch.sequences, batch.prompt_lens, params,
                                       max_batch_tokens=o.max_batch_tokens, grad=True)
            ref_lp = None
            if self.reference is not None and o.kl_coef:
                ref_lp = torch.cat(response_logprobs(self.reference, batch.sequences, batch.prompt_lens, params,
                                                     max_batch_tokens=o.max_batch_tokens))
        new = torch.cat(new_lp)
        adv = batch.token_advantages([len(t) for t in new_lp]).to(new.device)
        old = torch.cat([t.float() for t in batch.rollout_logprobs]).to(new.device)
        mask = batch.token_mask()
        loss, stats = policy_loss(new, old, adv, None if mask is None else mask.to(new.device), o.clip_low,
                                  o.clip_high, ref_lp, o.kl_coef, normalizer=normalizer)
        return new_lp, ref_lp, loss, stats

    def train_step(self, batch: TrainBatch) -> tuple[list[torch.Tensor], dict]:
        """Returns the trainer logprobs (detached, before the update) and the loss statistics."""
        o = self.optim_config
        self.model.train()
        groups = micro_batches([len(s) for s in batch.sequences], o.micro_batch_tokens)
        self.model.zero_grad(set_to_none=True)
        if len(groups) == 1:
            new_lp, _, loss, stats = self._forward_loss(batch)
            loss.backward()
        else:  # each group's forward and backward in turn; the stats over the whole batch at the end
            mask = batch.token_mask()
            total = (torch.tensor(sum(len(t) for t in batch.rollout_logprobs)) if mask is None
                     else mask.sum()).clamp_min(1)
            new_lp, ref_parts = [None] * len(batch.sequences), []
            for rows in groups:
                part_lp, part_ref, part_loss, _ = self._forward_loss(batch.subset(rows), normalizer=total)
                part_loss.backward()
                for i, lp in zip(rows, part_lp):
                    new_lp[i] = lp.detach()
                if part_ref is not None:
                    ref_parts.append(part_ref)
            with torch.no_grad():
                new = torch.cat(new_lp)
                old = torch.cat([t.float() for t in batch.rollout_logprobs]).to(new.device)
                adv = batch.token_advantages([len(t) for t in new_lp]).to(new.device)
                loss, stats = policy_loss(new, old, adv, None if mask is None else mask.to(new.device),
                                          o.clip_low, o.clip_high, torch.cat(ref_parts) if ref_parts else None,
                                          o.kl_coef)
        for master, p in zip(self.masters, self.model.parameters()):
            master.grad = None if p.grad is None else p.grad.detach().float()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters, o.grad_clip)
        self.optimizer.step()
        with torch.no_grad():
            for master, p in zip(self.masters, self.model.parameters()):
                p.copy_(master.to(p.dtype))
        self.model.zero_grad(set_to_none=True)
        self.model.eval()
        stats["micro_batches"] = len(groups)
        stats.update(loss=float(loss.detach()), grad_norm=float(grad_norm))
        return [t.detach() for t in new_lp], stats

    # -- checkpoints: everything a resumed run needs to continue bit for bit ---------------------------
    def save(self, path: Path) -> None:
        torch.save({"model": self.model.state_dict(), "masters": [m.detach() for m in self.masters],
                    "optimizer": self.optimizer.state_dict()}, path)

    def load(self, path: Path) -> None:
        state = torch.load(path, map_location=self.model.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        with torch.no_grad():
            for m, saved in zip(self.masters, state["masters"]):
                m.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
