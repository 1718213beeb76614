"""Attention's layout helpers, shared by the strict reference, the Triton kernel and the native control:
the input checks (once a layout), the layout's per-sequence bounds read to the host once, and one
sequence's keys gathered from a packed or paged cache."""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from rlkit.kernels.errors import OpInputError, check_float, check_same
from rlkit.types import AttentionLayout

OP = "attention"


_CHECKED: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Layouts whose values `check_inputs` has read, with the token counts they were checked against: a
model's layers all take one layout, whose tensors are not changed in place (the plan cache below
assumes the same), so its device values are read once a forward, not twice a layer."""


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(OP, name, t)
    check_same(OP, q=q, k=k, v=v)
    if q.dim() != 3:
        raise OpInputError(OP, f"q has shape {tuple(q.shape)}; expected [tokens, heads, head_dim]")
    want_k = "[pages, page_size, kv_heads, head_dim]" if layout.paged_keys else "[tokens, kv_heads, head_dim]"
    if k.dim() != (4 if layout.paged_keys else 3) or k.shape != v.shape:
        raise OpInputError(OP, f"k {tuple(k.shape)} and v {tuple(v.shape)}; expected both {want_k}")
    if k.shape[-1] != q.shape[-1] or q.shape[1] % k.shape[-2]:
        raise OpInputError(OP, f"q {tuple(q.shape)} against k {tuple(k.shape)}: head_dim must match and "
                               f"heads must be a multiple of kv_heads")
    if layout.one_query_per_seq:
        # shapes only: the values are the caller's (the engine's), read by no host code on this path
        bt = layout.block_table
        if q.shape[0] != layout.num_seqs or bt is None or bt.dim() != 2 or bt.shape[0] != layout.num_seqs:
            raise OpInputError(OP, f"decode layout: q {tuple(q.shape)} needs one query per sequence and a "
                                   f"[{layout.num_seqs}, pages] block table")
        return
    checked = (q.shape[0], tuple(k.shape[:2]), k.device)
    if _CHECKED.get(layout) == checked:
        return
    if layout.cu_seqlens_q.numel() != layout.num_seqs + 1 or int(layout.cu_seqlens_q[-1]) != q.shape[0]:
        raise OpInputError(OP, f"cu_seqlens_q {layout.cu_seqlens_q.tolist()} does not cover q's "
                               f"{q.shape[0]} tokens")
    q_lens = layout.cu_seqlens_q[1:] - layout.cu_seqlens_q[:-1]
    if bool((layout.query_start + q_lens != layout.context_lens).any()):
        raise OpInputError(OP, "context_lens must equal query_start + query length for every sequence")
    if layout.paged_keys:
        page = k.shape[1]
        need = (layout.context_lens + page - 1) // page
        if layout.block_table.dim() != 2 or bool((need > layout.block_table.shape[1]).any()):
            raise OpInputError(OP, f"block_table {tuple(layout.block_table.shape)} has too few pages for "
                                   f"context_lens {layout.context_lens.tolist()} at page_size {page}")
    else:
        cu_k = layout.cu_seqlens_k
        if cu_k is None or cu_k.numel() != layout.num_seqs + 1 or int(cu_k[-1]) != k.shape[0]:
            raise OpInputError(OP, "packed keys need cu_seqlens_k covering k's tokens")
        if bool(((cu_k[1:] - cu_k[:-1]) != layout.context_lens).any()):
            raise OpInputError(OP, "packed keys: each sequence needs exactly context_lens keys")
    _CHECKED[layout] = checked


_HOST_BOUNDS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def host_bounds(layout: AttentionLayout) -> dict[str, list[int]]:
    """The layout's per-sequence bounds as host lists, read in one device-to-host copy once a layout (a
    loop over the sequences then reads no device value)."""
    hit = _HOST_BOUNDS.get(layout)
    if hit is None:
        hit = _HOST_BOUNDS[layout] = _read_bounds(layout)
    return hit


def _read_bounds(layout: AttentionLayout) -> dict[str, list[int]]:
    parts = {"cu_q": layout.cu_seqlens_q, "query_start": layout.query_start, "context_lens": layout.context_lens}
    if layout.cu_seqlens_k is not None:
        parts["cu_k"] = layout.cu_seqlens_k
    flat = torch.cat([t.reshape(-1).to(torch.int64) for t in parts.values()]).tolist()
    out, at = {}, 0
    for name, t in parts.items():
        out[name], at = flat[at : at + t.numel()], at + t.numel()
    return out


def gather_keys(k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, i: int,
                bounds: dict[str, list[int]] | None = None):
    """Keys/values of sequence i at positions 0..context_lens[i]-1: [ctx, kv_heads, head_dim].
    bounds: `host_bounds(layout)`, when the caller has read them."""
    ctx = bounds["context_lens"][i] if bounds else int(layout.context_lens[i])
    if not layout.paged_keys:
        lo = bounds["cu_k"][i] if bounds else int(layout.cu_seqlens_k[i])
        return k[lo : lo + ctx], v[lo : lo + ctx]
    page = k.shape[1]
    pages = layout.block_table[i, : (ctx + page - 1) // page].to(torch.int64)
    kk = k[pages].reshape(-1, *k.shape[2:])[:ctx]
    vv = v[pages].reshape(-1, *v.shape[2:])[:ctx]
    return kk, vv
