"""Qwen3 (dense): the one model definition the trainer and the rollout engine both run.

A plain nn.Module whose every op goes through `rlkit.ops`, so the active numerics contract, not this
file, decides strict or native. Parameter names are Hugging Face's (model.layers.N.self_attn.q_proj...),
so state_dict() is an HF checkpoint. Each op is a small leaf module (RMSNorm, Linear, Rope,
AttentionCore, SwiGLU) so forward hooks can capture every op's output by name: that is what the
first-divergence locator in rlkit/divergence.py reads.

One forward serves every caller through `ForwardBatch`:
- trainer recompute: packed full sequences, `ForwardBatch.packed(seqs)` (varlen causal prefill);
- rollout engine: prefill, chunked prefill and decode against a paged KV cache (`kv_cache` +
  `slot_mapping` say where this call's keys are written; the layout's block table says where to read).

Shapes: T tokens in the call, h hidden, H query heads, G kv heads, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from rlkit import ops
from rlkit.model.config import Qwen3Config
from rlkit.model.parallel import TensorParallel, shard_state_dict
from rlkit.types import AttentionLayout, SamplingParams


class KVCache(Protocol):
    """What the model needs from a paged KV cache (rlkit.rollout.kv_cache.PagedKVCache)."""

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def write(self, index: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] absolute positions
    layout: AttentionLayout
    kv_cache: KVCache | None = None
    slot_mapping: torch.Tensor | None = None  # [T] flat cache slot of each token's K/V
    seq_ids: list[str] | None = None  # one name per sequence in layout order (activation capture uses it)
    max_position: int | None = None  # a bound on positions known to the caller (no host read: CUDA graphs)

    @classmethod
    def packed(cls, sequences: list[torch.Tensor], seq_ids: list[str] | None = None) -> "ForwardBatch":
        """Full sequences packed back to back (trainer recompute; no KV cache)."""
        lens = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
        cu = torch.zeros(len(sequences) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(lens, 0)
        ids = torch.cat([s.to(torch.int64) for s in sequences])
        positions = torch.cat([torch.arange(int(n)) for n in lens])
        dev = ids.device
        # the positions' bound is known here, so RoPE reads none on the host (a sync a call on CUDA)
        return cls(ids, positions.to(dev), AttentionLayout.prefill(cu.to(dev)), seq_ids=seq_ids,
                   max_position=int(lens.max()) if len(sequences) else None)


# -- leaf modules: one op each --------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return ops.rms_norm(x, self.weight, self.eps, residual)


class Linear(nn.Module):
    """y = x @ weight.T. `row_parallel` (o_proj, down_proj): the layer whose K tensor parallelism splits,
    whose strict K reduction is the contract's chunk tree at every TP size; with `reduce_over` (a shard
    of it) the result is summed over the tensor-parallel group."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype,
                 reduce_over: TensorParallel | None = None, row_parallel: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        self.row_parallel = row_parallel
        self.reduce_over = reduce_over if reduce_over is not None and reduce_over.size > 1 else None
        if self.reduce_over is not None and not row_parallel:
            raise ValueError("only a row-parallel Linear is reduced over a tensor-parallel group")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reduce_over is None:
            return ops.linear(x, self.weight, row_parallel=self.row_parallel)
        return ops.linear(x, self.weight, row_parallel=True, tp_group=self.reduce_over.group,
                          tp_size=self.reduce_over.size)


class Rope(nn.Module):
    def __init__(self, theta: float):
        super().__init__()
        self.theta = theta

    def forward(self, x: torch.Tensor, positions: torch.Tensor, max_position: int | None = None) -> torch.Tensor:
        return ops.rope(x, positions, self.theta, max_position)


class AttentionCore(nn.Module):
    def forward(self, q, k, v, layout: AttentionLayout) -> torch.Tensor:
        return ops.attention(q, k, v, layout)


class SwiGLU(nn.Module):
    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return ops.swiglu(gate, up)


# -- blocks ---------------------------------------------------------------------------------------
class Qwen3Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer_index: int, tp: TensorParallel):
        super().__init__()
        dt, h, d = cfg.torch_dtype, cfg.hidden_size, cfg.head_dim
        self.layer_index = layer_index
        self.heads, self.kv_heads, self.head_dim = tp.q_heads(cfg), tp.kv_heads(cfg), d  # this rank's
        self.q_proj = Linear(h, self.heads * d, dt)
        self.k_proj = Linear(h, self.kv_heads * d, dt)
        self.v_proj = Linear(h, self.kv_heads * d, dt)
        self.o_proj = Linear(self.heads * d, h, dt, reduce_over=tp, row_parallel=True)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, dt)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, dt)
        self.q_rope = Rope(cfg.rope_theta)
        self.k_rope = Rope(cfg.rope_theta)
        self.attn = AttentionCore()

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.heads, self.head_dim))      # [T, H, D]
        k = self.k_norm(self.k_proj(x).view(t, self.kv_heads, self.head_dim))   # [T, G, D]
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)                # [T, G, D]
        q = self.q_rope(q, batch.positions, batch.max_position)
        k = self.k_rope(k, batch.positions, batch.max_position)
        if batch.kv_cache is not None:
            batch.kv_cache.write(self.layer_index, batch.slot_mapping, k, v)
            k, v = batch.kv_cache.layer(self.layer_index)                        # [pages, page, G, D]
        out = self.attn(q, k, v, batch.layout)                                   # [T, H, D]
        return self.o_proj(out.reshape(t, self.heads * self.head_dim))


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config, tp: TensorParallel):
        super().__init__()
        dt, h, i = cfg.torch_dtype, cfg.hidden_size, tp.intermediate(cfg)
        self.gate_proj = Linear(h, i, dt)
        self.up_proj = Linear(h, i, dt)
        self.down_proj = Linear(i, h, dt, reduce_over=tp, row_parallel=True)
        self.act = SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer_index: int, tp: TensorParallel):
        super().__init__()
        dt = cfg.torch_dtype
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt)
        self.self_attn = Qwen3Attention(cfg, layer_index, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt)
        self.mlp = Qwen3MLP(cfg, tp)

    def forward(self, hidden, residual, batch: ForwardBatch):
        if residual is None:  # first layer: the embedding is the residual stream
            residual = hidden
            normed = self.input_layernorm(hidden)
        else:
            normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(normed, batch)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed), residual


class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config, tp: TensorParallel):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.torch_dtype)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg, i, tp) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.torch_dtype)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        hidden, residual = F.embedding(batch.input_ids, self.embed_tokens.weight), None  # [T, h]
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, batch)
        out, _ = self.norm(hidden, residual)
        return out


class Qwen3ForCausalLM(nn.Module):
    """The causal LM: `forward` gives final hidden states; `logprobs` the strict/native token logprobs.
    With `tp` (rlkit/model/parallel.py) the module is one tensor-parallel rank's shard; its parameter
    names are the whole model's, its shapes the shard's."""

    def __init__(self, cfg: Qwen3Config, tp: TensorParallel | None = None):
        super().__init__()
        self.config = cfg
        self.tp = tp if tp is not None and tp.size > 1 else None
        tp = tp or TensorParallel()
        tp.check(cfg)
        self.model = Qwen3Model(cfg, tp)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, cfg.torch_dtype)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    @property
    def kv_heads(self) -> int:
        """KV heads this module holds (all of them unless it is a tensor-parallel shard)."""
        return (self.tp or TensorParallel()).kv_heads(self.config)

    def shard(self, full_state_dict) -> dict[str, torch.Tensor]:
        """This module's slices of a whole-model state dict (the dict itself when not sharded)."""
        return dict(full_state_dict) if self.tp is None else shard_state_dict(full_state_dict, self.config, self.tp)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch)  # [T, h]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return ops.logits(hidden, self.lm_head_weight)  # [T, vocab] fp32

    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor,
                 params: SamplingParams | None = None) -> torch.Tensor:
        return ops.logprob(hidden, self.lm_head_weight, targets, params)  # [T] fp32

    @torch.no_grad()
    def init_weights(self, seed: int) -> "Qwen3ForCausalLM":
        """Seeded random init, identical on every machine: drawn in fp32 on the CPU in parameter-name
        order, then cast. Linear and embedding weights ~ N(0, initializer_range); norms = 1. A
        tensor-parallel shard draws the whole model's weights and keeps its slices."""
        if self.tp is not None:
            whole = Qwen3ForCausalLM(self.config).init_weights(seed)
            self.load_state_dict(self.shard(whole.state_dict()))
            return self
        return _draw_weights(self, seed, torch.device("cpu"))


@torch.no_grad()
def _draw_weights(model: Qwen3ForCausalLM, seed: int, device: torch.device) -> Qwen3ForCausalLM:
    """fp32 N(0, initializer_range) draws on `device` in parameter-name order, cast; norms = 1."""
    g = torch.Generator(device=device).manual_seed(seed)
    std = model.config.initializer_range
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32, device=device).mul_(std).to(p.dtype))
    return model


def build_model(cfg: Qwen3Config, seed: int = 0, device: str | torch.device = "cpu",
                tp: TensorParallel | None = None) -> Qwen3ForCausalLM:
    """A Qwen3 with seeded random weights on `device` (with `tp`: this rank's shard of it)."""
    return Qwen3ForCausalLM(cfg, tp).init_weights(seed).to(device)


def build_model_on_device(cfg: Qwen3Config, seed: int, device: str | torch.device) -> Qwen3ForCausalLM:
    """A Qwen3 with seeded random weights allocated and drawn on `device` (fp32 draws in parameter-name
    order, as `init_weights`): seconds for billions of parameters on a GPU, where `build_model` draws on
    the CPU and copies. The values depend on the device type's generator, so they are not those of
    `build_model`."""
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return _draw_weights(model, seed, model.device)
