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

    def train_step(self, batch: TrainBatch) -> tuple[list[torch.Tensor], dict]:
        """Returns the trainer logprobs (detached, before the update) and the loss statistics."""
        o = self.optim_config
        self.model.train()
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
                                  o.clip_high, ref_lp, o.kl_coef)
        self.model.zero_grad(set_to_none=True)
        loss.backward()
        for master, p in zip(self.masters, self.model.parameters()):
            master.grad = None if p.grad is None else p.grad.detach().float()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters, o.grad_clip)
        self.optimizer.step()
        with torch.no_grad():
            for master, p in zip(self.masters, self.model.parameters()):
                p.copy_(master.to(p.dtype))
        self.model.zero_grad(set_to_none=True)
        self.model.eval()
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
