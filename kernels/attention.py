"""Strict causal GQA attention: one KV schedule for varlen prefill, chunked prefill and paged decode.

Contract (AttentionSpec): keys are consumed in blocks of `block_size` absolute positions; blocks are
grouped into splits of `split_size` positions. Within a split an online softmax walks the blocks in
order (fp32 running max, running sum, unnormalized output); q.k over head_dim and p.V over a block are
canonical pairwise trees; scores = (q.k) * head_dim**-0.5. Split states merge through their
log-sum-exp in the canonical pairwise tree over split index. A query at position p sees keys 0..p.

Why the three modes agree bit for bit: a query's result is a function of its own q, the keys/values at
positions 0..p, and this fixed schedule. Everything that varies between modes (how many other queries,
how far the gathered context reaches, where its pages live) only adds blocks or splits that the query
cannot see, and those are exact pass-throughs: a block with no visible key leaves the state untouched
(selected with torch.where, not multiplied by 1), a masked key contributes an exact +0.0, an invisible
split is skipped by the tree (kernels/tree.py, "trailing empties"). Keys are zero-padded to whole blocks
so every block tree has exactly `block_size` leaves in every mode.

The reference vectorizes over all sequences of a call by padding them to a common length; the guards
make the padding invisible, which is itself the batch-invariance claim under test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlkit.contract import NumericsContract
from rlkit.kernels.errors import OpInputError, check_float, check_same
from rlkit.kernels.tree import pairwise_reduce, pairwise_sum_dim

OP = "attention"


@dataclass(frozen=True)
class AttentionLayout:
    """Where each sequence's queries sit and where its keys live.

    Sequence i owns queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] at absolute positions
    query_start[i], query_start[i]+1, ...; it sees keys at positions 0..context_lens[i]-1, where
    context_lens[i] = query_start[i] + (its number of queries). Keys are either packed
    (k[cu_seqlens_k[i]:cu_seqlens_k[i+1]], position 0 first) or paged (block_table[i] lists the cache
    pages holding positions 0.., page_size positions each).
    """

    cu_seqlens_q: torch.Tensor
    query_start: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_k: torch.Tensor | None = None
    block_table: torch.Tensor | None = None

    @classmethod
    def prefill(cls, cu_seqlens: torch.Tensor) -> "AttentionLayout":
        """Packed causal prefill: every sequence's queries are its keys, starting at position 0."""
        cu = cu_seqlens.to(torch.int64)
        lens = cu[1:] - cu[:-1]
        return cls(cu_seqlens_q=cu, query_start=torch.zeros_like(lens), context_lens=lens, cu_seqlens_k=cu)

    @classmethod
    def paged(cls, query_lens: torch.Tensor, context_lens: torch.Tensor,
              block_table: torch.Tensor) -> "AttentionLayout":
        """Chunked prefill (query_lens > 1) or decode (query_lens == 1) against a paged KV cache that
        already holds these queries' own keys."""
        q_lens = query_lens.to(torch.int64)
        ctx = context_lens.to(torch.int64)
        cu = torch.zeros(q_lens.numel() + 1, dtype=torch.int64, device=q_lens.device)
        cu[1:] = torch.cumsum(q_lens, 0)
        return cls(cu_seqlens_q=cu, query_start=ctx - q_lens, context_lens=ctx, block_table=block_table)

    @property
    def num_seqs(self) -> int:
        return int(self.query_start.numel())

    @property
    def paged_keys(self) -> bool:
        return self.block_table is not None


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


def gather_keys(k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, i: int):
    """Keys/values of sequence i at positions 0..context_lens[i]-1: [ctx, kv_heads, head_dim]."""
    ctx = int(layout.context_lens[i])
    if not layout.paged_keys:
        lo = int(layout.cu_seqlens_k[i])
        return k[lo : lo + ctx], v[lo : lo + ctx]
    page = k.shape[1]
    pages = layout.block_table[i, : (ctx + page - 1) // page].to(torch.int64)
    kk = k[pages].reshape(-1, *k.shape[2:])[:ctx]
    vv = v[pages].reshape(-1, *v.shape[2:])[:ctx]
    return kk, vv


def _pad_batch(q, k, v, layout, block):
    """Pad every sequence to common lengths: queries to the longest query run, keys to the longest
    context rounded up to whole blocks. Returns fp32 tensors and the positions (-1 marks padding)."""
    n = layout.num_seqs
    q_lens = (layout.cu_seqlens_q[1:] - layout.cu_seqlens_q[:-1]).tolist()
    ctx = layout.context_lens.tolist()
    n_q = max(q_lens)
    n_k = -(-max(ctx) // block) * block
    heads, d = q.shape[1], q.shape[2]
    kv_heads = k.shape[-2]
    dev = q.device
    qp = torch.zeros(n, n_q, heads, d, dtype=torch.float32, device=dev)
    kp = torch.zeros(n, n_k, kv_heads, d, dtype=torch.float32, device=dev)
    vp = torch.zeros(n, n_k, kv_heads, d, dtype=torch.float32, device=dev)
    q_pos = torch.full((n, n_q), -1, dtype=torch.int64, device=dev)
    for i in range(n):
        lo = int(layout.cu_seqlens_q[i])
        qp[i, : q_lens[i]] = q[lo : lo + q_lens[i]].float()
        start = int(layout.query_start[i])
        q_pos[i, : q_lens[i]] = torch.arange(start, start + q_lens[i], device=dev)
        kk, vv = gather_keys(k, v, layout, i)
        kp[i, : ctx[i]] = kk.float()
        vp[i, : ctx[i]] = vv.float()
    k_pos = torch.arange(n_k, device=dev)
    k_valid = k_pos[None, :] < torch.tensor(ctx, device=dev)[:, None]  # [n, n_k]
    return qp, kp, vp, q_pos, k_valid, q_lens


def _merge(a, b):
    """Merge split state b into a (pairwise LSE merge); b with no visible key passes a through."""
    (ma, la, acca, va), (mb, lb, accb, vb) = a, b
    m = torch.maximum(ma, mb)
    wa = torch.exp(ma - m)
    wb = torch.exp(mb - m)
    l = la * wa + lb * wb
    acc = acca * wa.unsqueeze(-1) + accb * wb.unsqueeze(-1)
    take = vb  # [n, n_q]; a is visible whenever b is (splits are ordered, queries see prefixes)
    sel = take[:, :, None, None]
    return (torch.where(sel, m, ma), torch.where(sel, l, la),
            torch.where(sel.unsqueeze(-1), acc, acca), va | vb)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout,
              contract: NumericsContract) -> torch.Tensor:
    """q: [tokens, heads, head_dim] -> [tokens, heads, head_dim] in q's dtype."""
    check_inputs(q, k, v, layout)
    spec = contract.attention
    block, split = spec.block_size, spec.split_size
    qp, kp, vp, q_pos, k_valid, q_lens = _pad_batch(q, k, v, layout, block)
    n, n_q, heads, d = qp.shape
    kv_heads = kp.shape[2]
    group = heads // kv_heads
    scale = d ** -0.5
    qg = qp.view(n, n_q, kv_heads, group, 1, d)
    neg_inf = torch.tensor(float("-inf"), device=q.device)
    zero = torch.zeros((), device=q.device)

    def empty_state():
        return (torch.full((n, n_q, kv_heads, group), float("-inf"), device=q.device),
                torch.zeros(n, n_q, kv_heads, group, device=q.device),
                torch.zeros(n, n_q, kv_heads, group, d, device=q.device),
                torch.zeros(n, n_q, dtype=torch.bool, device=q.device))

    splits = []
    state = empty_state()
    for b0 in range(0, kp.shape[1], block):
        kb = kp[:, b0 : b0 + block].permute(0, 2, 1, 3)  # [n, kvh, B, d]
        vb = vp[:, b0 : b0 + block].permute(0, 2, 1, 3)
        key_pos = torch.arange(b0, b0 + block, device=q.device)
        # visible[s, i, j]: query i of sequence s may see key j of this block
        visible = (key_pos[None, None, :] <= q_pos[:, :, None]) & k_valid[:, None, b0 : b0 + block]
        vis = visible[:, :, None, None, :]  # [n, n_q, 1, 1, B]
        dots = pairwise_sum_dim(qg * kb[:, None, :, None, :, :], -1)  # [n, n_q, kvh, g, B]
        scores = torch.where(vis, dots * scale, neg_inf)
        m, l, acc, seen = state
        m_new = torch.maximum(m, scores.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(scores - m_new.unsqueeze(-1))
        l_new = l * alpha + pairwise_sum_dim(p, -1)
        pv_terms = torch.where(vis.unsqueeze(-1), p.unsqueeze(-1) * vb[:, None, :, None, :, :], zero)
        acc_new = acc * alpha.unsqueeze(-1) + pairwise_sum_dim(pv_terms, -2)
        any_vis = visible.any(-1)  # [n, n_q]
        g4 = any_vis[:, :, None, None]
        state = (torch.where(g4, m_new, m), torch.where(g4, l_new, l),
                 torch.where(g4.unsqueeze(-1), acc_new, acc), seen | any_vis)
        if (b0 + block) % split == 0 or b0 + block >= kp.shape[1]:
            splits.append(state)
            state = empty_state()
    m, l, acc, _ = pairwise_reduce(splits, _merge)
    out = acc / l.unsqueeze(-1)  # [n, n_q, kvh, g, d]
    out = out.reshape(n, n_q, heads, d)
    return torch.cat([out[i, : q_lens[i]] for i in range(n)]).to(q.dtype)


def native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
    """torch SDPA per sequence (causal, or an explicit mask when queries start past position 0)."""
    check_inputs(q, k, v, layout)
    outs = []
    heads, kv_heads = q.shape[1], k.shape[-2]
    for i in range(layout.num_seqs):
        lo, hi = int(layout.cu_seqlens_q[i]), int(layout.cu_seqlens_q[i + 1])
        kk, vv = gather_keys(k, v, layout, i)
        qi = q[lo:hi].transpose(0, 1)  # [H, n, d]
        ki = kk.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        vi = vv.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        start = int(layout.query_start[i])
        if start == 0:
            o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True)
        else:
            q_pos = torch.arange(start, start + (hi - lo), device=q.device)
            mask = torch.arange(kk.shape[0], device=q.device)[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)
