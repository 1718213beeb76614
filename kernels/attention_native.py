"""Attention's native control: what a trainer and a serving engine really run. A prefill on CUDA (packed
from position 0, as a trainer runs it, or chunked against the paged cache, as an engine does) is one
varlen flash call; other prefills torch SDPA a sequence; paged decode on CUDA the split-K
flash-decoding kernel (the strict kernel's code under a schedule of its own, kernels/attention_kernel.py),
elsewhere one masked SDPA over the gathered pages. Its bits answer to nothing; its backward repeats
(kernels/determinism.py)."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import warnings

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from rlkit.contract import NumericsContract
from rlkit.kernels import _triton as _tr
from rlkit.kernels.attention_kernel import DECODE_TILE, MAX_SLOTS, attention_plan, launch
from rlkit.kernels.attention_layout import check_inputs, gather_keys, host_bounds
from rlkit.kernels.determinism import deterministic_algorithms
from rlkit.types import AttentionLayout


def native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
    """The native control. A prefill on CUDA: one varlen flash call (packed, as a trainer runs it, or
    over keys gathered from the paged cache, as an engine runs it); otherwise torch SDPA per sequence
    (causal, or an explicit mask when queries start past position 0; on CUDA its fused kernels, on the
    CPU its math form); a decode layout: the paged flash-decoding
    kernel on CUDA, one batched SDPA over the gathered pages elsewhere. Under autograd the same forward,
    its backward run under torch's deterministic algorithms (`_ReplayableNative`)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _ReplayableNative.apply(q, k, v, layout)
    return native_forward(q, k, v, layout)


class _ReplayableNative(torch.autograd.Function):
    """Native attention whose backward repeats bit for bit (kernels/determinism.py says why): the forward
    builds native's own autograd graph and keeps it; the backward walks that graph under deterministic
    algorithms. Nothing is recomputed: the saved tensors are those native's graph saves anyway."""

    @staticmethod
    def forward(ctx, q, k, v, layout):
        with torch.enable_grad():
            leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
            out = native_forward(*leaves, layout)
        ctx.graph = (out, leaves)
        return out.detach()

    @staticmethod
    def backward(ctx, go):
        out, leaves = ctx.graph
        del ctx.graph  # the graph's saved tensors go with it
        with deterministic_algorithms():
            gq, gk, gv = torch.autograd.grad(out, leaves, go)
        return gq, gk, gv, None


def native_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
    """`native` without the deterministic backward: torch's own autograd graph when grad is on."""
    check_inputs(q, k, v, layout)
    if layout.one_query_per_seq:
        if _tr.on_gpu(q, k, v) and q.dtype in (torch.bfloat16, torch.float16) and q.shape[1] // k.shape[-2] <= NATIVE_DECODE_TILE[0]:
            return native_paged_decode(q, k, v, layout)
        return _native_decode(q, k, v, layout)
    outs = []
    heads, kv_heads = q.shape[1], k.shape[-2]
    bounds = host_bounds(layout)
    if varlen_prefill_ok(q, layout, bounds):
        try:
            return native_varlen_prefill(q, k, v, layout, bounds)
        except torch.OutOfMemoryError:
            raise  # the memory's answer, not the kernel's: the loop would need as much
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
            _varlen_refused(e)
    # on CUDA as [1, H, n, d]: SDPA's fused kernels (flash, cuDNN, memory-efficient) take 4-D inputs
    # only; 3-D ones run its math backend, which holds the H x n x n scores (and keeps them for
    # backward). The CPU keeps the math form, HF's eager attention.
    fused = q.is_cuda
    for i in range(layout.num_seqs):
        lo, hi = bounds["cu_q"][i], bounds["cu_q"][i + 1]
        kk, vv = gather_keys(k, v, layout, i, bounds)
        qi = q[lo:hi].transpose(0, 1)  # [H, n, d]
        ki = kk.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        vi = vv.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        if fused:
            qi, ki, vi = qi[None], ki[None], vi[None]
        start = bounds["query_start"][i]
        if start == 0:
            o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True)
        else:
            q_pos = torch.arange(start, start + (hi - lo), device=q.device)
            mask = torch.arange(kk.shape[0], device=q.device)[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask)
        outs.append((o[0] if fused else o).transpose(0, 1))
    return torch.cat(outs)


def _varlen_attn():
    """torch's varlen flash attention (`torch.nn.attention.varlen.varlen_attn`) and how this torch spells
    "causal" (torch 2.10: is_causal=True; later: window_size=(-1, 0)), or None where it is absent."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    names = inspect.signature(varlen_attn).parameters
    if "window_size" in names:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in names:
        causal = {"is_causal": True}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in names


def varlen_prefill_ok(q, layout: AttentionLayout, bounds: dict[str, list[int]]) -> bool:
    """fp16/bf16 CUDA tensors, a torch with varlen flash attention, and either keys in the paged cache
    (an engine's prefill chunks, decode rows among them, any query start) or packed keys with every
    sequence from position 0 (a trainer's prefill): the one-launch native form serves it."""
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _VARLEN is not None
            and (layout.paged_keys or not any(bounds["query_start"])))


def native_varlen_prefill(q, k, v, layout: AttentionLayout, bounds: dict[str, list[int]]) -> torch.Tensor:
    """The native prefill on CUDA: every sequence in one varlen flash call (FlashAttention's own
    schedule; its backward is flash's too). Paged keys are first gathered into one packed [keys, kv_heads,
    head_dim] tensor (`_paged_key_rows`: one index_select each for K and V, as an engine's chunked prefill
    over a paged cache does); causal masking is then flash's, aligned at the bottom right, so a chunk whose
    queries start past position 0 sees every key before them. K/V are expanded to the query heads where
    this torch's wrapper takes no `enable_gqa`."""
    varlen_attn, causal, takes_gqa = _VARLEN
    cu_q, longest_q = _packed_queries(layout, q.device, bounds)
    if layout.paged_keys:
        rows, cu_k = _paged_key_rows(layout, k.shape[1], bounds)
        k, v = k.flatten(0, 1).index_select(0, rows), v.flatten(0, 1).index_select(0, rows)
        longest_k = max(bounds["context_lens"], default=0)
    else:
        cu_k, longest_k = cu_q, longest_q
    group = q.shape[1] // k.shape[-2]
    extra = {}
    if group > 1 and takes_gqa:
        extra["enable_gqa"] = True
    elif group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return varlen_attn(q, k, v, cu_q, cu_k, longest_q, longest_k, **causal, **extra)


def _packed_queries(layout: AttentionLayout, device, bounds: dict[str, list[int]]) -> tuple[torch.Tensor, int]:
    """What flash's varlen ops take for the queries: int32 cu_seqlens on the device and the longest run."""
    cu = layout.cu_seqlens_q.to(device=device, dtype=torch.int32)
    return cu, max((b - a for a, b in zip(bounds["cu_q"], bounds["cu_q"][1:])), default=0)


_KEY_ROWS: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""layout (weakly, by identity) -> (page size, key rows, cu_seqlens_k): every layer of a forward shares
its layout, so the rows are built once a forward."""


def _paged_key_rows(layout: AttentionLayout, page: int, bounds: dict[str, list[int]]):
    """Rows of the cache flattened to [pages * page_size, ...] that hold each sequence's keys at positions
    0..context_lens[i]-1, sequence after sequence, and the int32 cu_seqlens of that packing. Built on the
    device from the block table, without a host sync (the bounds are already on the host)."""
    hit = _KEY_ROWS.get(layout)
    if hit is not None and hit[0] == page:
        return hit[1], hit[2]
    ctx = bounds["context_lens"]
    total = sum(ctx)
    dev = layout.block_table.device
    cu_k = torch.tensor(list(itertools.accumulate(ctx, initial=0)), dtype=torch.int64, device=dev)
    seq = torch.repeat_interleave(torch.arange(len(ctx), device=dev), cu_k[1:] - cu_k[:-1], output_size=total)
    pos = torch.arange(total, device=dev) - cu_k[seq]
    rows = layout.block_table[seq, pos // page].to(torch.int64) * page + pos % page
    cu_k = cu_k.to(torch.int32)
    _KEY_ROWS[layout] = (page, rows, cu_k)
    return rows, cu_k


_VARLEN = _varlen_attn()


def flash_stats_buffer(q: torch.Tensor, k: torch.Tensor, layout: AttentionLayout):
    """Where a forward can leave each row's log-sum-exp so that FlashAttention's varlen backward takes it
    in place of its own forward's (`flash_backward`): (stats, rows) -- an empty fp32 tensor in the shape and
    memory order this torch's flash kernel keeps it, and the same memory viewed as [token, head] for the
    forward to write -- or None where that backward cannot serve this call (not CUDA fp16/bf16, keys not
    packed from position 0, or this torch's flash op refused the probe `_flash_lse_order`)."""
    if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)) or layout.paged_keys or layout.one_query_per_seq:
        return None
    if any(host_bounds(layout)["query_start"]):
        return None
    order = _flash_lse_order(q.device, q.dtype, q.shape[1], k.shape[-2], q.shape[-1])
    if order is None:
        return None
    t, heads = q.shape[0], q.shape[1]
    if order == "heads_tokens":
        stats = torch.empty(heads, t, dtype=torch.float32, device=q.device)
        return stats, stats.t()
    stats = torch.empty(t, heads, dtype=torch.float32, device=q.device)
    return stats, stats


def flash_backward(go, q, k, v, out, stats, layout: AttentionLayout):
    """FlashAttention's varlen backward (its deterministic form: kernels/determinism.py) from a forward's
    output and log-sum-exp (the `stats` of a `flash_stats_buffer` the forward filled), without running
    flash's forward again: (dq, dk, dv). GQA as flash takes it (dk, dv in the KV heads)."""
    cu, longest = _packed_queries(layout, q.device, host_bounds(layout))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    with deterministic_algorithms():
        return _flash_bwd(go.contiguous(), q, k, v, out, stats, cu, longest)


def _flash_bwd(go, q, k, v, out, stats, cu, longest):
    unused = torch.empty(0, dtype=torch.int64, device=q.device)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(go, q, k, v, out, stats, cu, cu, longest, longest, 0.0, True,
                                                          unused, unused, scale=q.shape[-1] ** -0.5)
    return dq, dk, dv


_LSE_ORDER: dict[tuple, str | None] = {}
"""(device, dtype, heads, kv heads, head dim) -> "heads_tokens", "tokens_heads" or None (`_flash_lse_order`)."""


def _flash_lse_order(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, d: int) -> str | None:
    """How this torch's varlen flash forward lays out its log-sum-exp ([heads, tokens] or [tokens, heads]),
    read once from a two-sequence probe of this head shape, whose backward is then run from that
    log-sum-exp too; None (with a warning) where either op refuses it or the layout is neither."""
    key = (str(device), dtype, heads, kv_heads, d)
    if key in _LSE_ORDER:
        return _LSE_ORDER[key]
    gen = torch.Generator(device=device).manual_seed(5)
    lens, t = (3, 2), 5
    q = torch.randn(t, heads, d, generator=gen, device=device).to(dtype)
    k = torch.randn(t, kv_heads, d, generator=gen, device=device).to(dtype)
    v = torch.randn(t, kv_heads, d, generator=gen, device=device).to(dtype)
    cu = torch.tensor([0, lens[0], t], dtype=torch.int32, device=device)
    order = None
    try:
        out, lse = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max(lens), max(lens), 0.0, True, False,
                                                          scale=d ** -0.5)[:2]
        if tuple(lse.shape) == (heads, t):
            order = "heads_tokens"
        elif tuple(lse.shape) == (t, heads):
            order = "tokens_heads"
        if order is not None:
            with deterministic_algorithms():
                grads = _flash_bwd(torch.ones_like(out), q, k, v, out, lse, cu, max(lens))
            if tuple(grads[1].shape) != tuple(k.shape):
                order = None
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        warnings.warn(f"strict attention's backward: this torch's varlen flash refused the log-sum-exp probe "
                      f"({type(e).__name__}: {e}); the backward recomputes the native forward", RuntimeWarning,
                      stacklevel=3)
        order = None
    _LSE_ORDER[key] = order
    return order


def _varlen_refused(error: Exception) -> None:
    """This torch's varlen flash refused a call: say so once and loop over the sequences from now on
    (tests/gpu/test_native_kernels_gpu.py fails where this happens)."""
    global _VARLEN
    _VARLEN = None
    warnings.warn(f"native attention: varlen flash attention refused a packed prefill ({type(error).__name__}: "
                  f"{error}); the native path runs SDPA a sequence at a time", RuntimeWarning, stacklevel=3)


def _native_decode(q, k, v, layout: AttentionLayout) -> torch.Tensor:
    """All sequences' single queries at once: gather every page of the block table, mask the positions
    past each context, one SDPA call (no host sync, so it can be captured in a CUDA graph)."""
    n, heads, d = q.shape
    kv_heads, page = k.shape[-2], k.shape[1]
    table = layout.block_table.to(torch.int64)
    width = table.shape[1] * page
    visible = torch.arange(width, device=q.device)[None, :] < layout.context_lens[:, None]  # [n, L]
    keep = visible[:, None, :, None]
    # positions past a context hold whatever the pages held (stale or never written): zeroed, so a
    # masked score or value cannot turn into NaN
    kk = torch.where(keep, k[table].reshape(n, width, kv_heads, d).transpose(1, 2), 0)  # [n, G, L, D]
    vv = torch.where(keep, v[table].reshape(n, width, kv_heads, d).transpose(1, 2), 0)
    if heads != kv_heads:
        kk = kk.repeat_interleave(heads // kv_heads, 1)
        vv = vv.repeat_interleave(heads // kv_heads, 1)
    o = F.scaled_dot_product_attention(q[:, :, None, :], kk, vv, attn_mask=visible[:, None, None, :])
    return o[:, :, 0, :]


NATIVE_DECODE_TILE = DECODE_TILE
"""The native control's decode tile: the strict decode's (16 rows, a KV head's query group padded, and 2
warps), so the two differ only in the row sum; `native_paged_decode(tile=...)` times others."""
_NATIVE_DECODE_SCHEDULE = NumericsContract().replace(
    attention=dataclasses.replace(NumericsContract().attention, row_sum="tile_reduce"))
"""Split and block sizes of the native paged decode (the default contract's: 512 / 64 positions), its split states folded in
order, its row sums a plain row reduction (what a serving engine's flash-decoding does): a schedule, not a
contract -- the native control's bits answer to nothing."""


def native_paged_decode(q, k, v, layout: AttentionLayout, tile: tuple[int, int] | None = None) -> torch.Tensor:
    """The native control for paged decode on CUDA: split-K flash-decoding straight off the page table,
    as a serving engine's paged kernel runs it (this module's online-softmax kernel with the strict
    decode's tile, splits in parallel when the batch leaves SMs idle, merged in a second launch), its row sums a
    plain row reduction, so its bits differ from prefill's (measured: lab/LOG.md 2026-12-01); no host
    sync, so decode graphs capture it. The masked SDPA over the whole block table (`_native_decode`) stays
    for CPUs and for what this kernel does not cover."""
    if k.stride(-1) != 1 or v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    plan = attention_plan(q.shape, k, layout, _NATIVE_DECODE_SCHEDULE, tile=tile or NATIVE_DECODE_TILE)
    if plan["nslots"] > MAX_SLOTS:
        return _native_decode(q, k, v, layout)
    return launch(plan, q, k, v, _NATIVE_DECODE_SCHEDULE)[0]
