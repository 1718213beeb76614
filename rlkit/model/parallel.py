"""Tensor parallelism of rlkit's Qwen3, in Megatron's layout, for the rollout engine.

A rank of a tensor-parallel group of `size` holds:
- q_proj, k_proj, v_proj, gate_proj, up_proj: column-parallel, its slice of the output rows (query heads
  rank*H/size ..., the KV heads those query heads read, its slice of the MLP);
- o_proj, down_proj: row-parallel, its slice of the input columns; the product is reduced over the group
  by `rlkit.ops.linear(..., row_parallel=True, tp_size=size)`: strict, the rank's K subtree in fp32 and the contract's
  canonical all-reduce (kernels/collectives.py), so the sum has the bits of the unsharded GEMM;
- embedding, norms, lm_head: whole (every rank computes the same logits and samples the same tokens).
When there are fewer KV heads than ranks, a KV head is replicated on the ranks whose query heads read it
(size must then be a multiple of the KV head count), as Megatron and vLLM do.

Under the strict contract every op is per-head or per-row, or reduces through the canonical tree, so a
rank's logprobs equal the unsharded model's bit for bit (tests/rollout/test_tensor_parallel.py: rollout TP
1, 2, 4 and a Megatron trainer at TP 2 against them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from rlkit.model.config import Qwen3Config


@dataclass(frozen=True)
class TensorParallel:
    size: int = 1
    rank: int = 0
    group: Any = None
    """The torch.distributed group of the `size` ranks (None: the default group)."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor parallel rank {self.rank} of size {self.size}: need 0 <= rank < size")

    def check(self, cfg: Qwen3Config) -> None:
        heads, kv, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
        problems = []
        if heads % self.size:
            problems.append(f"{heads} query heads do not split over {self.size} ranks")
        if kv % self.size and self.size % kv:
            problems.append(f"{kv} KV heads neither split over nor replicate onto {self.size} ranks")
        if inter % self.size:
            problems.append(f"intermediate size {inter} does not split over {self.size} ranks")
        if problems:
            raise ValueError(f"{cfg.name}: tensor parallel size {self.size}: " + "; ".join(problems))

    def q_heads(self, cfg: Qwen3Config) -> int:
        return cfg.num_attention_heads // self.size

    def kv_heads(self, cfg: Qwen3Config) -> int:
        return max(1, cfg.num_key_value_heads // self.size)

    def kv_start(self, cfg: Qwen3Config) -> int:
        """The first KV head this rank holds: the one its first query head reads."""
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        return self.rank * self.q_heads(cfg) // group

    def intermediate(self, cfg: Qwen3Config) -> int:
        return cfg.intermediate_size // self.size


_COLUMN_Q = re.compile(r"\.self_attn\.q_proj\.weight$")
_COLUMN_KV = re.compile(r"\.self_attn\.[kv]_proj\.weight$")
_COLUMN_MLP = re.compile(r"\.mlp\.(gate|up)_proj\.weight$")
_ROW_O = re.compile(r"\.self_attn\.o_proj\.weight$")
_ROW_DOWN = re.compile(r"\.mlp\.down_proj\.weight$")


def shard_state_dict(full: Mapping[str, torch.Tensor], cfg: Qwen3Config,
                     tp: TensorParallel) -> dict[str, torch.Tensor]:
    """This rank's slices of a whole (Hugging Face layout) state dict; whole tensors stay whole."""
    d = cfg.head_dim
    q0, nq = tp.rank * tp.q_heads(cfg), tp.q_heads(cfg)
    kv0, nkv = tp.kv_start(cfg), tp.kv_heads(cfg)
    i0, ni = tp.rank * tp.intermediate(cfg), tp.intermediate(cfg)
    out = {}
    for name, t in full.items():
        if _COLUMN_Q.search(name):
            t = t[q0 * d : (q0 + nq) * d]
        elif _COLUMN_KV.search(name):
            t = t[kv0 * d : (kv0 + nkv) * d]
        elif _COLUMN_MLP.search(name):
            t = t[i0 : i0 + ni]
        elif _ROW_O.search(name):
            t = t[:, q0 * d : (q0 + nq) * d]
        elif _ROW_DOWN.search(name):
            t = t[:, i0 : i0 + ni]
        out[name] = t.contiguous()
    return out


def unshard_state_dicts(parts: list[Mapping[str, torch.Tensor]], cfg: Qwen3Config) -> dict[str, torch.Tensor]:
    """The whole state dict from every rank's shard, in rank order (the inverse of `shard_state_dict`;
    a replicated KV head is taken once)."""
    size = len(parts)
    tps = [TensorParallel(size, r) for r in range(size)]
    d = cfg.head_dim
    out = {}
    for name, first in parts[0].items():
        if _COLUMN_Q.search(name) or _COLUMN_MLP.search(name):
            out[name] = torch.cat([p[name] for p in parts])
        elif _COLUMN_KV.search(name):
            owners = {}
            for tp, p in zip(tps, parts):  # the first rank holding each KV head slice
                owners.setdefault(tp.kv_start(cfg), p[name])
            out[name] = torch.cat([owners[k] for k in sorted(owners)])
            if out[name].shape[0] != cfg.num_key_value_heads * d:
                raise ValueError(f"{name}: {size} shards hold {out[name].shape[0] // d} of "
                                 f"{cfg.num_key_value_heads} KV heads")
        elif _ROW_O.search(name) or _ROW_DOWN.search(name):
            out[name] = torch.cat([p[name] for p in parts], dim=1)
        else:
            out[name] = first
    return out
