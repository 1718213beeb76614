"""Weight conversion between rlkit/HF Qwen3 names and Megatron-core's GPTModel layout, with TP and PP.

What: four pure functions on name -> tensor dicts, composed as
    HF --hf_to_megatron--> Megatron (TP 1, global layer numbers) --shard_tp--> one TP rank's shard
                                                                  --stage_slice--> one PP stage's part
and back with unshard_tp / megatron_to_hf. Every step only moves, concatenates and slices tensors (no
arithmetic, no dtype change), so a round trip is bit-exact; tests/train/test_megatron.py checks it.

Megatron's fused layouts (megatron-core 0.16.1, attention.py `get_query_key_value_tensors` and
mlp.py with gated_linear_unit):
- linear_qkv: rows grouped by KV group g = 0..G-1, each group [its H/G query heads; k head g; v head g],
  D rows per head. A TP shard takes G/tp whole groups (contiguous rows), so G must divide by tp.
- linear_fc1 (SwiGLU): at TP 1 the rows are [gate; up]. TP rank r holds [gate_r; up_r] (its slice of
  each), which is why sharding fc1 is not a plain row split.
- Column-parallel weights (qkv, fc1, word embeddings, output layer) split on dim 0; row-parallel
  (linear_proj, linear_fc2) on dim 1; norms are replicated.

Run: `python -m pytest -q -m megatron tests/train/test_megatron.py -k convert`.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

from rlkit.model.config import Qwen3Config

Tensors = dict[str, torch.Tensor]

# Megatron suffix inside decoder.layers.N -> rlkit/HF suffix inside model.layers.N (1:1 renames).
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_COLUMN = ("self_attention.linear_qkv.weight", "mlp.linear_fc1.weight")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: Qwen3Config) -> torch.Tensor:
    """[H*D, h], [G*D, h], [G*D, h] -> Megatron's [(H + 2G) * D, h], interleaved by KV group."""
    h, g, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    hidden = q.shape[1]
    qg = q.reshape(g, h // g, d, hidden)
    kg = k.reshape(g, 1, d, hidden)
    vg = v.reshape(g, 1, d, hidden)
    return torch.cat([qg, kg, vg], dim=1).reshape((h + 2 * g) * d, hidden)


def split_qkv(qkv: torch.Tensor, cfg: Qwen3Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of fuse_qkv (works on any whole number of groups, e.g. one TP shard's)."""
    h, g, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    hidden = qkv.shape[1]
    per = h // g + 2
    groups = qkv.shape[0] // (per * d)
    x = qkv.reshape(groups, per, d, hidden)
    q = x[:, : per - 2].reshape(-1, hidden)
    k = x[:, per - 2].reshape(-1, hidden)
    v = x[:, per - 1].reshape(-1, hidden)
    return q, k, v


def hf_to_megatron(hf: Mapping[str, torch.Tensor], cfg: Qwen3Config) -> Tensors:
    """rlkit/HF state dict -> Megatron GPTModel names at TP 1, global layer numbers."""
    out: Tensors = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
                    "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for meg, name in _LAYER_RENAMES.items():
            out[dst + meg] = hf[src + name]
        out[dst + "self_attention.linear_qkv.weight"] = fuse_qkv(
            hf[src + "self_attn.q_proj.weight"], hf[src + "self_attn.k_proj.weight"],
            hf[src + "self_attn.v_proj.weight"], cfg)
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]], dim=0)
    return out


def megatron_to_hf(meg: Mapping[str, torch.Tensor], cfg: Qwen3Config) -> Tensors:
    """Megatron names at TP 1 (global layer numbers) -> rlkit/HF state dict (what
    `Qwen3ForCausalLM.state_dict()` holds: no lm_head when tied)."""
    out: Tensors = {"model.embed_tokens.weight": meg["embedding.word_embeddings.weight"],
                    "model.norm.weight": meg["decoder.final_layernorm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = meg["output_layer.weight"]
    for i in range(cfg.num_hidden_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for m, name in _LAYER_RENAMES.items():
            out[dst + name] = meg[src + m]
        q, k, v = split_qkv(meg[src + "self_attention.linear_qkv.weight"], cfg)
        out[dst + "self_attn.q_proj.weight"], out[dst + "self_attn.k_proj.weight"] = q, k
        out[dst + "self_attn.v_proj.weight"] = v
        gate, up = torch.chunk(meg[src + "mlp.linear_fc1.weight"], 2, dim=0)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
    return out


def _kind(name: str) -> str:
    """'column', 'fc1', 'row' or 'replicated' for a Megatron parameter name."""
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return "column"
    if name.endswith("mlp.linear_fc1.weight"):
        return "fc1"
    if name.endswith(_COLUMN[0]):
        return "column"
    if name.endswith(_ROW):
        return "row"
    return "replicated"


def check_tp(cfg: Qwen3Config, tp: int) -> None:
    for what, n in (("num_key_value_heads", cfg.num_key_value_heads),
                    ("num_attention_heads", cfg.num_attention_heads),
                    ("intermediate_size", cfg.intermediate_size), ("vocab_size", cfg.vocab_size)):
        if n % tp:
            raise ValueError(f"TP {tp} does not divide {what}={n}")


def check_layout(cfg: Qwen3Config, tp: int, pp: int) -> None:
    """ValueError (one line) when `cfg` cannot be laid out at TP x PP. Context parallelism has no
    condition: its split takes any sequence lengths (context_parallel.py)."""
    check_tp(cfg, tp)
    if cfg.num_hidden_layers % pp:
        raise ValueError(f"PP {pp} does not divide num_hidden_layers={cfg.num_hidden_layers}")


def shard_tp(meg: Mapping[str, torch.Tensor], cfg: Qwen3Config, tp: int, rank: int) -> Tensors:
    """One TP rank's shard of a TP-1 Megatron state dict (views; clone to own them)."""
    check_tp(cfg, tp)
    out: Tensors = {}
    for name, t in meg.items():
        kind = _kind(name)
        if kind == "column":
            out[name] = torch.chunk(t, tp, dim=0)[rank]
        elif kind == "row":
            out[name] = torch.chunk(t, tp, dim=1)[rank]
        elif kind == "fc1":
            gate, up = torch.chunk(t, 2, dim=0)
            out[name] = torch.cat([torch.chunk(gate, tp, 0)[rank], torch.chunk(up, tp, 0)[rank]], 0)
        else:
            out[name] = t
    return out


def unshard_tp(shards: list[Mapping[str, torch.Tensor]], cfg: Qwen3Config) -> Tensors:
    """Reassemble TP shards (rank order) into a TP-1 state dict. Replicated tensors must agree
    bitwise across ranks (they are updated from identical gradients); a disagreement is an error."""
    out: Tensors = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        kind = _kind(name)
        if kind == "column":
            out[name] = torch.cat(parts, dim=0)
        elif kind == "row":
            out[name] = torch.cat(parts, dim=1)
        elif kind == "fc1":
            halves = [torch.chunk(p, 2, dim=0) for p in parts]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
        else:
            for r, p in enumerate(parts[1:], 1):
                if not (torch.equal(p, parts[0]) and torch.equal(p.view(-1).signbit(),
                                                                 parts[0].view(-1).signbit())):
                    raise ValueError(f"replicated {name} differs between TP rank 0 and rank {r}")
            out[name] = parts[0]
    return out


def stage_slice(meg: Mapping[str, torch.Tensor], first_layer: int, num_layers: int,
                pre_process: bool, post_process: bool, tied: bool) -> Tensors:
    """The part of a (TP-sharded) state dict that one pipeline stage holds, with the stage's local
    layer numbers (Megatron numbers each stage's decoder.layers from 0). A tied last stage that is
    not also the first holds its own copy of the embedding as `output_layer.weight`."""
    out: Tensors = {}
    for name, t in meg.items():
        m = _LAYER_RE.match(name)
        if m:
            i = int(m.group(1))
            if first_layer <= i < first_layer + num_layers:
                out[f"decoder.layers.{i - first_layer}.{m.group(2)}"] = t
        elif name == "embedding.word_embeddings.weight":
            if pre_process:
                out[name] = t
            if post_process and tied and not pre_process:
                out["output_layer.weight"] = t
        elif name in ("decoder.final_layernorm.weight", "output_layer.weight"):
            if post_process:
                out[name] = t
    return out


def merge_stages(parts: list[tuple[Mapping[str, torch.Tensor], int]]) -> Tensors:
    """Inverse of stage_slice: (stage dict, first layer) pairs -> global layer numbers. A tied last
    stage's `output_layer.weight` copy is dropped when the first stage's embedding is present."""
    out: Tensors = {}
    for part, first in parts:
        for name, t in part.items():
            m = _LAYER_RE.match(name)
            if m:
                out[f"decoder.layers.{int(m.group(1)) + first}.{m.group(2)}"] = t
            else:
                out.setdefault(name, t)
    return out
