"""The strict attention's Triton kernel (GPU): kernels/attention.py's schedule, one kernel for prefill,
chunked prefill and paged decode, with its launch plan and launcher. `launch` returns what it launched
(plan and compiled kernel) to the caller that asks, the benchmarks. The native control's paged decode
(kernels/attention_native.py) launches it under a schedule of its own."""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from rlkit.contract import NumericsContract
from rlkit.types import AttentionLayout

# =====================================================================================================
# Triton (GPU): the same schedule, one kernel for all three modes.
#
# A program owns one query tile of one sequence and one KV head: BM rows, each row one (query, query head
# of this KV head's group) pair, so BM / group consecutive queries. For each split it runs the online
# softmax over the split's `block_size`-key blocks in order (blocks aligned to absolute positions; q.k
# and p.V on tensor cores, fp32 accumulation; p rounded to the value dtype for the p.V product, as
# FlashAttention does; a block a row cannot see leaves its state untouched), and merges the split states
# as the contract says: folded into one running state in split order (v4), or with the pairwise LSE tree
# over split index (v1-v3), evaluated as a binary counter (a stack of complete subtrees: slot l holds a
# finished subtree of 2^l splits; the final fold adds the slots of n's set bits from the smallest up;
# that is exactly the pairwise tree, and a query's trailing invisible splits are exact pass-throughs, so
# every query gets the tree of its own splits).
#
# Why prefill, chunked prefill and decode give the same bits. Every product and sum a row's result
# depends on is either elementwise (exp, the rescales, the merges, the final division) or a tensor-core
# product (q.k, p.V), whose k order is the matrix unit's whatever the tile. The one per-row reduction
# that is neither is the block's sum of p: under v1-v3 it is a row reduction whose order follows the
# tile's register layout, so every mode runs the same tile (BLOCK_M x block_size, NUM_WARPS); under v4
# (`row_sum = "tensor_core"`) it is p times a column of ones on the matrix unit (its row max is exact:
# every column holds the same sum), so the plan picks the tile per mode: 16 rows and 2 warps for a decode
# batch, PREFILL_TILE otherwise. Decode with few programs computes the split states in parallel (MODE
# 1, one program per split, states stored in fp32) and merges them in a second launch (MODE 2) with the
# same @jit merge code: an fp32 store/load is exact, so the merge sees the same values. FMA fusion is
# off (kernels/_triton.py): each merge rounds as written.
# =====================================================================================================
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels._triton import jit, tl  # noqa: E402

BLOCK_M = 64
"""Rows a program under v1-v3: the wgmma M of one warpgroup; fixed for every mode (see above)."""
NUM_WARPS = 8
"""Two warpgroups share the 64 x head_dim accumulator (32 fp32 registers a thread per split state), so
the split-tree stack of a 16k-token prefill (7 states) stays mostly in registers."""
DECODE_TILE = (16, 2)
"""v4, a decode batch (one query a sequence): 16 rows (a KV head's query group, padded) and 2 warps; the SMs
stream keys instead of idling on padding rows. Measured on an H100 against 4 and 8 warps, 32 rows and 2-5
pipeline stages (lab/LOG.md 2026-12-07 session 35, `--parts attention --tune`): against the native
control's paged decode at 16 x 4, 1.07 (B = 16 ctx 8k), 1.33 / 1.28 (B = 64 ctx 1k / 8k) for 16 x 2 where
16 x 4 gave 0.90 / 1.13 / 1.10; the same bits in every shape. The native control then takes the same tile
(kernels/attention_native.py), and strict reads 0.99-1.01 of it."""
PREFILL_TILE = (128, 8)
"""v4, every other batch (prefill, chunked prefill, decode beside a prefill chunk): (rows, warps). Measured
on the H200 against 64x4, 64x8 and 128x4 (lab/LOG.md 2026-12-01 session 3): 128 rows, two warpgroups."""
UNMASKED_FULL = True
"""Whether plans run the key blocks a tile sees whole without masks and guards (the same values: see
`_block_step`). Measured on the H200 (lab/LOG.md 2026-12-01 session 5; `rlkit bench kernels --tune`,
attention_tune "unmasked"): prefill 0.83 / 0.84 / 0.82 of SDPA flash at S = 1k / 4k / 16k against 0.76 /
0.72 / 0.69 with masks on every block, paged decode at B = 64 1.07 / 1.03 of the native control's against
0.94 / 0.91; the same bits in all nine timed shapes and in tests/gpu's every-decode-position test (2,000
decode positions fused and split, and both prefills, against the masked kernel)."""
UNMASKED_FULL_SPLIT = False
"""Whether the split-parallel decode (few sequences: a sequence's splits in programs of their own) runs
the whole blocks without masks too. No: in the same H200 run as UNMASKED_FULL's numbers (6e92a98,
lab/bench/h200-2026-12-01-v5/bench-6e92a98.jsonl.gz and attention-unmasked-6e92a98.jsonl), against the
native control's paged decode, masked / unmasked: B = 1 ctx 1k 3.01 / 1.31, ctx 8k 1.08 / 0.72; B = 16 ctx
1k 1.19 / 1.18, ctx 8k 0.81 / 0.79 (a split is 256 positions, so a tile sees few whole blocks and the
unmasked branch costs more than it saves). The same bits either way (tests/gpu: every decode position,
both forms)."""
LONGEST_FIRST = True
"""Whether a prefill plan lists each sequence's query tiles longest first (the most visible keys first):
under a causal mask a tile's work grows with its position, and the SMs take programs in grid order, so
the longest ones launched last leave a tail. Sequences keep their order, so programs running together
read one sequence's keys (sorted across a packed batch they would read all of them at once). Only the
order programs start in changes; each writes rows of its own. Measured on an H100 (lab/LOG.md 2026-12-07
session 35): 0.92 / 0.96 / 0.85 of SDPA flash at S = 1k / 4k / 16k against 0.87 / 0.83 / 0.82 in
position order, the same bits."""
MAX_SLOTS = 8
"""Stack depth: 2^8 - 1 splits = 65,280 positions at split 256 (Qwen3's context is 40,960)."""


@jit
def _merge_states(ma, la, aa, mb, lb, ab):
    """Merge split state b (the right subtree) into a, as the reference's `_merge`: through their
    log-sum-exp; b with no visible key passes a through unchanged."""
    vb = mb > float("-inf")
    m = tl.maximum(ma, mb)
    wa = tl.exp(ma - m)
    wb = tl.exp(mb - m)
    l = la * wa + lb * wb
    acc = aa * wa[:, None] + ab * wb[:, None]
    return tl.where(vb, m, ma), tl.where(vb, l, la), tl.where(vb[:, None], acc, aa)


@jit
def _stack_step(s, LVL: tl.constexpr, sm, sl, sa, cm, cl, ca, done):
    """Binary-counter step at level LVL after leaf s: merge into the carry while s's bits are 1, park the
    carry in the first slot whose bit is 0."""
    if done == 0:
        if ((s >> LVL) & 1) == 1:
            cm, cl, ca = _merge_states(sm, sl, sa, cm, cl, ca)
        else:
            sm, sl, sa = cm, cl, ca
            done = done + 1
    return sm, sl, sa, cm, cl, ca, done


@jit
def _fold_step(n, LVL: tl.constexpr, sm, sl, sa, fm, fl, fa, have):
    """Final fold: the slots of n's set bits, smallest subtree first (the right side of the tree)."""
    if ((n >> LVL) & 1) == 1:
        if have == 0:
            fm, fl, fa = sm, sl, sa
            have = have + 1
        else:
            fm, fl, fa = _merge_states(sm, sl, sa, fm, fl, fa)
    return fm, fl, fa, have


@jit
def _block_step(q, pos, b0, seq, kvh, ctx, k_ptr, v_ptr, k_base, bt_ptr, stride_kt, stride_ks, stride_kh,
                stride_bt, page, scale, m, l, acc, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                PAGED: tl.constexpr, IEEE: tl.constexpr, ROW_SUM_MMA: tl.constexpr, MASKED: tl.constexpr):
    """One key block [b0, b0 + BN) of the online softmax. MASKED=False only for a block every row of the
    tile sees whole (all its keys at or before the tile's first position, so inside the context): then
    every mask is all-true and every row has seen a key, and leaving the masks and guards out computes
    the very same values."""
    ds = tl.arange(0, D)
    kp = b0 + tl.arange(0, BN)
    kvalid = kp < ctx
    if PAGED:
        if MASKED:
            pg = tl.load(bt_ptr + seq.to(tl.int64) * stride_bt + kp // page, mask=kvalid, other=0)
        else:
            pg = tl.load(bt_ptr + seq.to(tl.int64) * stride_bt + kp // page)
        krow = pg.to(tl.int64) * stride_kt + (kp % page).to(tl.int64) * stride_ks
    else:
        krow = (k_base + kp).to(tl.int64) * stride_kt
    krow = krow + kvh * stride_kh
    if MASKED:
        kt = tl.load(k_ptr + krow[None, :] + ds[:, None], mask=kvalid[None, :], other=0.0)  # [D, BN]
        vb = tl.load(v_ptr + krow[:, None] + ds[None, :], mask=kvalid[:, None], other=0.0)  # [BN, D]
    else:
        kt = tl.load(k_ptr + krow[None, :] + ds[:, None])
        vb = tl.load(v_ptr + krow[:, None] + ds[None, :])
    if IEEE:
        qk = tl.dot(q, kt, input_precision="ieee")
    else:
        qk = tl.dot(q, kt)
    if MASKED:
        vis = kp[None, :] <= pos[:, None]
        sc = tl.where(vis, qk * scale, float("-inf"))
        m_blk = tl.max(sc, axis=1)
        seen = m_blk > float("-inf")
        m_new = tl.maximum(m, m_blk)
        m_use = tl.where(seen, m_new, 0.0)
    else:
        sc = qk * scale
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        m_use = m_new
    alpha = tl.exp(m - m_use)
    p = tl.exp(sc - m_use[:, None])
    if ROW_SUM_MMA:  # p.ones on the matrix unit: every column holds the row's sum, the max picks it
        ones = tl.full((BN, 16), 1.0, vb.dtype)  # 16: the narrowest dot Triton takes
        if IEEE:
            p_sum = tl.max(tl.dot(p, ones, input_precision="ieee"), axis=1)
        else:
            p_sum = tl.max(tl.dot(p.to(vb.dtype), ones), axis=1)
    else:
        p_sum = tl.sum(p, axis=1)
    l_new = l * alpha + p_sum
    if IEEE:
        pv = tl.dot(p, vb, input_precision="ieee")
    else:
        pv = tl.dot(p.to(vb.dtype), vb)
    acc_new = acc * alpha[:, None] + pv
    if MASKED:
        return tl.where(seen, m_new, m), tl.where(seen, l_new, l), tl.where(seen[:, None], acc_new, acc)
    return m_new, l_new, acc_new


@jit
def _split_state(q, pos, first_pos, s, last_pos, seq, kvh, ctx, k_ptr, v_ptr, k_base, bt_ptr, stride_kt,
                 stride_ks, stride_kh, stride_bt, page, scale,
                 BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, D: tl.constexpr,
                 PAGED: tl.constexpr, IEEE: tl.constexpr, ROW_SUM_MMA: tl.constexpr,
                 UNMASKED_FULL: tl.constexpr):
    """Online softmax of split s for the tile's rows over key blocks [s*SPLIT, ...) in order.
    UNMASKED_FULL: the blocks every row sees whole (ending at or before `first_pos`, the tile's first
    query position) run without masks (`_block_step`), the rest with them: the same values either way."""
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    lo = s * SPLIT
    hi = tl.minimum(lo + SPLIT, last_pos + 1)
    mid = lo
    if UNMASKED_FULL:
        mid = lo + tl.maximum(tl.minimum(hi, first_pos + 1) - lo, 0) // BN * BN
        for b0 in range(lo, mid, BN):
            m, l, acc = _block_step(q, pos, b0, seq, kvh, ctx, k_ptr, v_ptr, k_base, bt_ptr, stride_kt,
                                    stride_ks, stride_kh, stride_bt, page, scale, m, l, acc,
                                    BM, BN, D, PAGED, IEEE, ROW_SUM_MMA, False)
    for b0 in range(mid, hi, BN):
        m, l, acc = _block_step(q, pos, b0, seq, kvh, ctx, k_ptr, v_ptr, k_base, bt_ptr, stride_kt,
                                stride_ks, stride_kh, stride_bt, page, scale, m, l, acc,
                                BM, BN, D, PAGED, IEEE, ROW_SUM_MMA, True)
    return m, l, acc


@jit(do_not_specialize=["stride_bt", "MAXS", "stride_lt", "stride_lh"])
def _attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, wsm_ptr, wsa_ptr, lse_ptr, tile_seq_ptr, tile_q0_ptr, cu_q_ptr,
                 qstart_ptr, ctx_ptr, cu_k_ptr, bt_ptr, stride_qt, stride_qh, stride_kt, stride_ks,
                 stride_kh, stride_bt, stride_lt, stride_lh, page, H, MAXS, scale,
                 GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
                 D: tl.constexpr, PAGED: tl.constexpr, NSLOTS: tl.constexpr, MODE: tl.constexpr,
                 IEEE: tl.constexpr, ROW_SUM_MMA: tl.constexpr, SEQ_MERGE: tl.constexpr,
                 UNMASKED_FULL: tl.constexpr, STORE_LSE: tl.constexpr):
    """MODE 0: all splits and their merge in one program; 1: split program_id(2) only, state to the
    workspace; 2: the merge over the workspace's states. SEQ_MERGE: fold in split order (NSLOTS 0),
    else the pairwise tree through NSLOTS stack slots. UNMASKED_FULL: see `_split_state`. STORE_LSE:
    also write each row's log-sum-exp of its scaled scores (m + log l, fp32) at lse_ptr + token *
    stride_lt + head * stride_lh, for a backward that takes the forward's statistics (kernels/attention.py);
    the output's arithmetic is the same either way."""
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_lo = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_lo
    start = tl.load(qstart_ptr + seq)
    ctx = tl.load(ctx_ptr + seq)
    rows = tl.arange(0, BM)
    qi = q0 + rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = qi < q_len
    tok = (q_lo + qi).to(tl.int64)
    pos = tl.where(row_ok, start + qi, -1)
    last_pos = start + tl.minimum(q0 + BM // GROUP, q_len) - 1
    n_splits = last_pos // SPLIT + 1
    ds = tl.arange(0, D)
    if PAGED:
        k_base = 0
    else:
        k_base = tl.load(cu_k_ptr + seq)
    ws_row = (tok * H + head) * MAXS  # workspace index of (token, head, split 0)
    if MODE == 1:
        s = tl.program_id(2)
        if s < n_splits:
            q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + ds[None, :],
                        mask=row_ok[:, None], other=0.0)
            m, l, acc = _split_state(q, pos, start + q0, s, last_pos, seq, kvh, ctx, k_ptr, v_ptr, k_base,
                                     bt_ptr, stride_kt, stride_ks, stride_kh, stride_bt, page, scale,
                                     BM, BN, SPLIT, D, PAGED, IEEE, ROW_SUM_MMA, UNMASKED_FULL)
            tl.store(wsm_ptr + (ws_row + s) * 2, m, mask=row_ok)
            tl.store(wsm_ptr + (ws_row + s) * 2 + 1, l, mask=row_ok)
            tl.store(wsa_ptr + (ws_row + s)[:, None] * D + ds[None, :], acc, mask=row_ok[:, None])
    else:
        if MODE == 0:
            q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + ds[None, :],
                        mask=row_ok[:, None], other=0.0)
        fm = tl.full((BM,), float("-inf"), tl.float32)
        fl = tl.zeros((BM,), tl.float32)
        fa = tl.zeros((BM, D), tl.float32)
        m0, l0, a0 = fm, fl, fa
        m1, l1, a1 = fm, fl, fa
        m2, l2, a2 = fm, fl, fa
        m3, l3, a3 = fm, fl, fa
        m4, l4, a4 = fm, fl, fa
        m5, l5, a5 = fm, fl, fa
        m6, l6, a6 = fm, fl, fa
        m7, l7, a7 = fm, fl, fa
        for s in range(0, n_splits):
            if MODE == 0:
                cm, cl, ca = _split_state(q, pos, start + q0, s, last_pos, seq, kvh, ctx, k_ptr, v_ptr,
                                          k_base, bt_ptr, stride_kt, stride_ks, stride_kh, stride_bt, page,
                                          scale, BM, BN, SPLIT, D, PAGED, IEEE, ROW_SUM_MMA, UNMASKED_FULL)
            else:
                cm = tl.load(wsm_ptr + (ws_row + s) * 2, mask=row_ok, other=float("-inf"))
                cl = tl.load(wsm_ptr + (ws_row + s) * 2 + 1, mask=row_ok, other=0.0)
                ca = tl.load(wsa_ptr + (ws_row + s)[:, None] * D + ds[None, :], mask=row_ok[:, None],
                             other=0.0)
            if SEQ_MERGE:
                fm, fl, fa = _merge_states(fm, fl, fa, cm, cl, ca)
            done = s * 0
            if NSLOTS > 0:
                m0, l0, a0, cm, cl, ca, done = _stack_step(s, 0, m0, l0, a0, cm, cl, ca, done)
            if NSLOTS > 1:
                m1, l1, a1, cm, cl, ca, done = _stack_step(s, 1, m1, l1, a1, cm, cl, ca, done)
            if NSLOTS > 2:
                m2, l2, a2, cm, cl, ca, done = _stack_step(s, 2, m2, l2, a2, cm, cl, ca, done)
            if NSLOTS > 3:
                m3, l3, a3, cm, cl, ca, done = _stack_step(s, 3, m3, l3, a3, cm, cl, ca, done)
            if NSLOTS > 4:
                m4, l4, a4, cm, cl, ca, done = _stack_step(s, 4, m4, l4, a4, cm, cl, ca, done)
            if NSLOTS > 5:
                m5, l5, a5, cm, cl, ca, done = _stack_step(s, 5, m5, l5, a5, cm, cl, ca, done)
            if NSLOTS > 6:
                m6, l6, a6, cm, cl, ca, done = _stack_step(s, 6, m6, l6, a6, cm, cl, ca, done)
            if NSLOTS > 7:
                m7, l7, a7, cm, cl, ca, done = _stack_step(s, 7, m7, l7, a7, cm, cl, ca, done)
        have = n_splits * 0
        if NSLOTS > 0:
            fm, fl, fa, have = _fold_step(n_splits, 0, m0, l0, a0, fm, fl, fa, have)
        if NSLOTS > 1:
            fm, fl, fa, have = _fold_step(n_splits, 1, m1, l1, a1, fm, fl, fa, have)
        if NSLOTS > 2:
            fm, fl, fa, have = _fold_step(n_splits, 2, m2, l2, a2, fm, fl, fa, have)
        if NSLOTS > 3:
            fm, fl, fa, have = _fold_step(n_splits, 3, m3, l3, a3, fm, fl, fa, have)
        if NSLOTS > 4:
            fm, fl, fa, have = _fold_step(n_splits, 4, m4, l4, a4, fm, fl, fa, have)
        if NSLOTS > 5:
            fm, fl, fa, have = _fold_step(n_splits, 5, m5, l5, a5, fm, fl, fa, have)
        if NSLOTS > 6:
            fm, fl, fa, have = _fold_step(n_splits, 6, m6, l6, a6, fm, fl, fa, have)
        if NSLOTS > 7:
            fm, fl, fa, have = _fold_step(n_splits, 7, m7, l7, a7, fm, fl, fa, have)
        out = tl.math.div_rn(fa, fl[:, None] + tl.zeros_like(fa))
        tl.store(o_ptr + (tok * H + head)[:, None] * D + ds[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        if STORE_LSE:
            tl.store(lse_ptr + tok * stride_lt + head * stride_lh, fm + tl.log(fl), mask=row_ok)


_PLAN_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""layout (weakly, by identity) -> (the rest of the key, plan): every layer of one forward shares its
layout, so the host-side tile map is built once per forward, not once per layer; an entry dies with
its layout (the plan holds no reference back to it)."""


def tile_for(contract: NumericsContract, decode: bool, group: int) -> tuple[int, int]:
    """(rows, warps) of the strict kernel's tile: one tile for every mode while the contract's row sum
    follows the tile (v1-v3); under v4 a decode batch's own tile, which needs `group` to divide 16."""
    if contract.attention.row_sum == "tile_reduce":
        return BLOCK_M, NUM_WARPS
    if decode and DECODE_TILE[0] % group == 0:
        return DECODE_TILE
    return PREFILL_TILE


def attention_plan(q_shape, k, layout: AttentionLayout, contract: NumericsContract, mode: str | None = None,
                   tile: tuple[int, int] | None = None, stages: int | None = None,
                   unmasked_full: bool | None = None, longest_first: bool | None = None):
    """Host-side preparation of a launch (tile map, split count, strides): reusable while the layout is.
    `tile` (rows, warps): None = `tile_for(contract, ...)`; the benchmarks, the tests (every tile gives
    the same bits under v4) and the native control's paged decode pass their own. `stages`: the
    software pipeline's depth over the key blocks (None: Triton's default); it moves no bit.
    `unmasked_full`: run the key blocks a tile sees whole without masks (None: UNMASKED_FULL, or
    UNMASKED_FULL_SPLIT in the split-parallel decode); it moves no bit either (`_block_step`).
    `longest_first`: each sequence's tiles last to first (None: LONGEST_FIRST); no bit either."""
    if longest_first is None:
        longest_first = LONGEST_FIRST
    key = (tuple(q_shape), tuple(k.shape), tuple(k.stride()), contract.attention, mode, str(k.device), tile, stages,
           unmasked_full if unmasked_full is not None else (UNMASKED_FULL, UNMASKED_FULL_SPLIT), longest_first)
    hit = _PLAN_CACHE.get(layout)
    if hit is not None and hit[0] == key:
        return hit[1]
    spec = contract.attention
    t, heads, d = q_shape
    kv_heads = k.shape[-2]
    group = heads // kv_heads
    q_lens = None if layout.one_query_per_seq else (layout.cu_seqlens_q[1:] - layout.cu_seqlens_q[:-1]).tolist()
    decode = layout.one_query_per_seq or max(q_lens, default=1) == 1
    if tile is None:
        tile = tile_for(contract, decode, group)
    bq = tile[0] // group
    dev = k.device
    if layout.one_query_per_seq:
        # one tile a sequence; the split count is bounded by what the block table can hold (a split
        # past a sequence's context is skipped in the kernel), so nothing here reads a device value
        tiles = layout.num_seqs
        max_splits = max(1, -(-layout.block_table.shape[1] * k.shape[1] // spec.split_size))
        tile_seq = torch.arange(tiles, dtype=torch.int32, device=dev)
        tile_q0 = torch.zeros(tiles, dtype=torch.int32, device=dev)
    else:
        starts = layout.query_start.tolist()
        order = []  # (last position, sequence, first query) of every tile, sequence by sequence
        for i, (n, st) in enumerate(zip(q_lens, starts)):
            firsts = range(0, n, bq)
            order += [(st + min(q0 + bq, n) - 1, i, q0) for q0 in (reversed(firsts) if longest_first else firsts)]
        seqs, q0s = [i for _, i, _ in order], [q0 for _, _, q0 in order]
        max_splits = max((last // spec.split_size + 1 for last, _, _ in order), default=1)
        tiles = len(seqs)
        tile_seq = torch.tensor(seqs, dtype=torch.int32, device=dev) if seqs else None
        tile_q0 = torch.tensor(q0s, dtype=torch.int32, device=dev) if seqs else None
    sequential = spec.split_merge == "sequential"
    plan = dict(paged=layout.paged_keys, tiles=tiles, max_splits=max_splits,
                nslots=0 if sequential else max_splits.bit_length(), kv_heads=kv_heads, group=group, d=d,
                heads=heads, t=t)
    if tiles:
        plan["tile_seq"], plan["tile_q0"] = tile_seq, tile_q0
    plan["cu_q"] = layout.cu_seqlens_q.to(device=dev, dtype=torch.int32)
    plan["qstart"] = layout.query_start.to(device=dev, dtype=torch.int32)
    plan["ctx"] = layout.context_lens.to(device=dev, dtype=torch.int32)
    if layout.paged_keys:
        plan["cu_k"] = plan["cu_q"]
        plan["bt"] = layout.block_table.to(device=dev, dtype=torch.int32).contiguous()
        plan["k_strides"] = (k.shape[1], k.stride(0), k.stride(1), k.stride(2), plan["bt"].stride(0))
    else:
        plan["cu_k"] = layout.cu_seqlens_k.to(device=dev, dtype=torch.int32)
        plan["bt"] = plan["cu_q"]
        plan["k_strides"] = (1, k.stride(0), 0, k.stride(1), 0)
    if mode is None:
        mode = ("split" if decode and tiles * kv_heads < 2 * _tr.sm_count(dev) and max_splits > 1
                else "fused")
    plan["mode"] = mode
    plan["block_m"], plan["num_warps"] = tile
    plan["num_stages"] = stages
    if unmasked_full is None:
        unmasked_full = UNMASKED_FULL_SPLIT if mode == "split" else UNMASKED_FULL
    plan["unmasked_full"] = unmasked_full
    plan["longest_first"] = longest_first
    _PLAN_CACHE[layout] = (key, plan)
    return plan


def kernel_meta(plan: dict, contract: NumericsContract, dtype: torch.dtype) -> dict:
    """The compile-time arguments of `_attn_kernel` for `plan` (MODE aside): what decides its bits."""
    spec = contract.attention
    return dict(GROUP=plan["group"], BM=plan["block_m"], BN=spec.block_size, SPLIT=spec.split_size, D=plan["d"],
                PAGED=plan["paged"], NSLOTS=plan["nslots"], IEEE=dtype == torch.float32,
                ROW_SUM_MMA=spec.row_sum == "tensor_core", SEQ_MERGE=spec.split_merge == "sequential",
                UNMASKED_FULL=bool(plan.get("unmasked_full")),
                num_warps=plan["num_warps"], **({"num_stages": plan["num_stages"]} if plan["num_stages"] else {}),
                **_tr.launch_options(contract))


def launch(plan: dict, q, k, v, contract: NumericsContract,
           lse: torch.Tensor | None = None) -> tuple[torch.Tensor, list[_tr.Launch]]:
    """Run a prepared launch (the benchmarks time this alone): the output and what was launched.
    `lse`: an fp32 tensor indexed [token, head] (any strides) to also receive each row's log-sum-exp
    (STORE_LSE); the output's bits are the same with or without it."""
    t, heads, d = q.shape
    out = torch.empty(t, heads, d, dtype=q.dtype, device=q.device)
    launches: list[_tr.Launch] = []
    if not plan["tiles"]:
        return out, launches
    page, stride_kt, stride_ks, stride_kh, stride_bt = plan["k_strides"]
    bm, warps = plan["block_m"], plan["num_warps"]
    common = dict(kernel_meta(plan, contract, q.dtype), STORE_LSE=lse is not None)
    dummy = out.new_empty(1, dtype=torch.float32)
    lse_ptr, lse_strides = (lse, lse.stride()) if lse is not None else (dummy, (0, 0))
    args = (plan["tile_seq"], plan["tile_q0"], plan["cu_q"], plan["qstart"], plan["ctx"], plan["cu_k"], plan["bt"],
            q.stride(0), q.stride(1), stride_kt, stride_ks, stride_kh, stride_bt, *lse_strides, page, heads,
            plan["max_splits"], float(d ** -0.5))
    grid = (plan["tiles"], plan["kv_heads"])
    if plan["mode"] == "fused":
        compiled = _attn_kernel[grid](q, k, v, out, dummy, dummy, lse_ptr, *args, MODE=0, **common)
        launches.append(_tr.Launch("fused", dict(grid=grid, BM=bm, num_warps=warps), compiled))
    else:
        wsm = torch.empty(t * heads * plan["max_splits"] * 2, dtype=torch.float32, device=q.device)
        wsa = torch.empty(t * heads * plan["max_splits"] * d, dtype=torch.float32, device=q.device)
        compiled = _attn_kernel[grid + (plan["max_splits"],)](q, k, v, out, wsm, wsa, lse_ptr, *args, MODE=1,
                                                              **common)
        launches.append(_tr.Launch("split", dict(grid=grid + (plan["max_splits"],), BM=bm, num_warps=warps),
                                   compiled))
        compiled = _attn_kernel[grid](q, k, v, out, wsm, wsa, lse_ptr, *args, MODE=2, **common)
        launches.append(_tr.Launch("merge", dict(grid=grid, BM=bm, num_warps=warps), compiled))
    return out, launches


def gpu_supported(q, k, contract: NumericsContract) -> bool:
    heads, kv_heads, d = q.shape[1], k.shape[-2], q.shape[-1]
    spec = contract.attention
    group = heads // kv_heads if kv_heads else 0
    return (_tr.HAVE_TRITON and group > 0 and BLOCK_M % group == 0 and d & (d - 1) == 0 and 16 <= d <= 256
            and spec.block_size & (spec.block_size - 1) == 0 and 16 <= spec.block_size <= 128
            and q.dtype in (torch.bfloat16, torch.float16, torch.float32))
