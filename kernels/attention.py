"""Strict causal GQA attention: one KV schedule for varlen prefill, chunked prefill and paged decode.

Contract (AttentionSpec): keys are consumed in blocks of `block_size` absolute positions; blocks are
grouped into splits of `split_size` positions. Within a split an online softmax walks the blocks in
order (fp32 running max, running sum, unnormalized output); q.k over head_dim and p.V over a block are
canonical pairwise trees; scores = (q.k) * head_dim**-0.5; under `row_sum = "tensor_core"` (v4) the
block's p is rounded to the value dtype before it enters the sum and p.V. Split states merge through
their log-sum-exp, folded in split order (`split_merge = "sequential"`, v4) or in the canonical
pairwise tree over split index (v1-v3). A query at position p sees keys 0..p.

Why the three modes agree bit for bit: a query's result is a function of its own q, the keys/values at
positions 0..p, and this fixed schedule. Everything that varies between modes (how many other queries,
how far the gathered context reaches, where its pages live) only adds blocks or splits that the query
cannot see, and those are exact pass-throughs: a block with no visible key leaves the state untouched
(selected with torch.where, not multiplied by 1), a masked key contributes an exact +0.0, an invisible
split is skipped by the tree (kernels/tree.py, "trailing empties"). Keys are zero-padded to whole blocks
so every block tree has exactly `block_size` leaves in every mode.

The reference vectorizes over all sequences of a call by padding them to a common length; the guards
make the padding invisible, which is itself the batch-invariance claim under test.

This file holds the op: the reference, the strict dispatch (`strict`) and its autograd. The rest is in
three modules, imported here in this order (no module imports one above it):
- kernels/attention_layout.py: the input checks and the layout's bounds, which every part reads;
- kernels/attention_kernel.py: the Triton kernel that runs this schedule for CUDA tensors, its plan and
  launcher. It reads `attention.split_size`, `attention.block_size` and `gpu.fp_fusion`, and covers a
  power-of-two block_size in [16, 128] and, under the pairwise split merge (v1-v3), up to
  2^MAX_SLOTS - 1 splits a sequence; other cases run the reference;
- kernels/attention_native.py: the native control (varlen flash, SDPA, the paged flash-decoding, which
  launches the kernel under a schedule of its own), whose backward strict's backward also runs.
The names callers use (`attention.launch`, `attention.native`, ...) are importable from here.
The layout type lives in rlkit/types.py (`AttentionLayout`), shared with the model and the engines.
"""

from __future__ import annotations

import functools

import torch

from rlkit.contract import NumericsContract
from rlkit.kernels import _triton as _tr
from rlkit.kernels.attention_kernel import (  # noqa: F401 - the op's names, as callers spell them
    BLOCK_M, DECODE_TILE, MAX_SLOTS, NUM_WARPS, PREFILL_TILE, attention_plan, gpu_supported, kernel_meta, launch,
    tile_for)
from rlkit.kernels.attention_layout import OP, check_inputs, gather_keys, host_bounds  # noqa: F401
from rlkit.kernels.attention_native import (  # noqa: F401
    NATIVE_DECODE_TILE, flash_backward, flash_stats_buffer, native, native_forward, native_paged_decode,
    native_varlen_prefill, varlen_prefill_ok)
from rlkit.kernels.determinism import deterministic_algorithms
from rlkit.kernels.tree import pairwise_reduce, pairwise_sum_dim
from rlkit.types import AttentionLayout


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
        if spec.row_sum == "tensor_core":  # p as the matrix unit sees it: rounded to the value dtype
            p = p.to(v.dtype).float()
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
    if spec.split_merge == "sequential":
        m, l, acc, _ = functools.reduce(_merge, splits)
    else:
        m, l, acc, _ = pairwise_reduce(splits, _merge)
    out = acc / l.unsqueeze(-1)  # [n, n_q, kvh, g, d]
    out = out.reshape(n, n_q, heads, d)
    return torch.cat([out[i, : q_lens[i]] for i in range(n)]).to(q.dtype)


def triton_attention(q, k, v, layout: AttentionLayout, contract: NumericsContract, mode: str | None = None,
                     lse: torch.Tensor | None = None):
    """The Triton strict attention. mode: None (chosen: split-parallel for decode batches too small to
    fill the GPU, else one pass), "fused" or "split"; all give the same bits. `lse`: an fp32 [token,
    head] tensor (any strides) the kernel also writes each row's log-sum-exp into; the output's bits are
    the same either way. Returns the output, or (output, whether lse was written) when lse is given (a
    split stack deeper than MAX_SLOTS runs the reference, which writes none)."""
    check_inputs(q, k, v, layout)
    if k.stride(-1) != 1 or v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    plan = attention_plan(q.shape, k, layout, contract, mode)
    if plan["nslots"] > MAX_SLOTS:  # longer than the unrolled stack: the reference keeps the contract
        out = reference(q, k, v, layout, contract)
        return out if lse is None else (out, False)
    out = launch(plan, q, k, v, contract, lse=lse)[0]
    return out if lse is None else (out, True)


class _StrictAttention(torch.autograd.Function):
    """Forward: the strict attention (Triton on CUDA, the reference elsewhere). Backward: native's, that
    is FlashAttention's varlen backward under deterministic algorithms. Where flash can take the strict
    forward's own output and log-sum-exp (a trainer's packed prefill on CUDA: `flash_stats_buffer`),
    it runs from them (`flash_backward`); elsewhere native's forward is recomputed under autograd and its
    backward run, as `native`'s. Either way the gradients are not the contract's (only forwards are
    compared); the first form saves a flash forward a layer, the cost of a recompute."""

    @staticmethod
    def forward(ctx, q, k, v, layout, contract):
        ctx.layout = layout
        ctx.from_stats = False
        if _tr.on_gpu(q, k, v) and gpu_supported(q, k, contract):
            buffers = flash_stats_buffer(q, k, layout)
            if buffers is None:
                ctx.save_for_backward(q, k, v)
                return triton_attention(q, k, v, layout, contract)
            out, ctx.from_stats = triton_attention(q, k, v, layout, contract, lse=buffers[1])
            if ctx.from_stats:
                ctx.save_for_backward(q, k, v, out, buffers[0])
            else:
                ctx.save_for_backward(q, k, v)
            return out
        ctx.save_for_backward(q, k, v)
        return reference(q, k, v, layout, contract)

    @staticmethod
    def backward(ctx, go):
        if ctx.from_stats:
            q, k, v, out, stats = ctx.saved_tensors
            return (*flash_backward(go, q, k, v, out, stats, ctx.layout), None, None)
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = native_forward(qq, kk, vv, ctx.layout)
        with deterministic_algorithms():
            gq, gk, gv = torch.autograd.grad(out, (qq, kk, vv), go)
        return gq, gk, gv, None, None


def strict(q, k, v, layout: AttentionLayout, contract: NumericsContract):
    """Strict attention: the Triton kernel for CUDA tensors, the reference otherwise; under autograd the
    same forward with a native backward."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _StrictAttention.apply(q, k, v, layout, contract)
    if _tr.on_gpu(q, k, v) and gpu_supported(q, k, contract):
        return triton_attention(q, k, v, layout, contract)
    return reference(q, k, v, layout, contract)
