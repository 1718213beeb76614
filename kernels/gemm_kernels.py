"""The strict GEMM's Triton kernels (device code only): what runs the contract of kernels/gemm.py on tensor cores.

kernels/gemm.py holds the contract's reference, the launch plans and the launcher that calls these; the
device code lives here because together they pass 900 lines. Nothing here decides a plan: every kernel
computes the bits the reference defines, for the tiles, chunk placement and merge rule its launcher
passes as constexprs (C chunks, FOLD: contract gemm.chunk_merge = "sequential", STASH, SPLIT, ...).
"""

from __future__ import annotations

# =====================================================================================================
# Triton (GPU): the same contract, on tensor cores.
#
# What fixes a product's bits on the GPU, for every M: each K chunk [c*K/C, (c+1)*K/C) is summed from
# zero by a chain of tensor-core MMAs over `k_tile`-wide steps in K order (each step is k16 MMA steps,
# accumulated in fp32 in the instruction's fixed order); the C chunk sums meet in fp32 as the contract's
# `gemm.chunk_merge` says (FOLD: in chunk order, v5; else the pairwise tree); one rounding to the output
# dtype. Every launcher below runs exactly that; they differ only in which program computes which tile
# and chunk:
# - `_gemm_swapped_kernel` (decode, M <= 64): weights are the MMA's row operand (swap-AB), tokens its
#   column operand, and the grid runs over N tiles x K chunks, so the weights stream at full bandwidth
#   even for one token; the last of a tile's C programs to arrive (an atomic counter) loads the C fp32
#   partials and merges them;
# - `_gemm_tma_kernel` (M > 64 on Hopper, bf16/fp16): a persistent grid of [BM x BN] tiles loaded by
#   TMA; a tile's C chunk sums meet in registers (the ordered merge: two accumulators live) or, for the
#   tree with C = 4, with (c0 + c1) parked in the program's own fp32 slot; with too few tiles, the C chunks go to C
#   programs that combine as above (SPLIT=True). With C = 1 (contract v3's column-parallel layers) a
#   tile is one chain over K, which is what lets it reach cuBLAS speed;
# - `_gemm_continue_kernel` (contract v6's chained merge, TP ranks after the first): one chain over
#   the rank's K slice that starts from the running sum the ranks before it passed on;
# - `_gemm_tiles_kernel` (M > 64 elsewhere: fp32, a chunk not a whole number of K steps, C = 8, no TMA):
#   the same with pointer loads, in registers (SPLIT=False) or split over C programs (SPLIT=True).
# Where the chunk sums meet (registers, a slot or an fp32 workspace) and the tile shape never change a value: an
# fp32 store/load is exact and fp32 addition is commutative, so only the merge's grouping matters, and
# that is fixed. tests/gpu/test_kernels_gpu.py proves it on the H200: all launch configurations give
# identical bits, a row alone equals the same row in batches on both sides of every threshold.
# =====================================================================================================
from rlkit.kernels._triton import jit, tl

TREE_CHUNKS = (1, 2, 4, 8)
"""Chunk counts the GPU kernels implement (the tree is unrolled); others use the reference."""


@jit
def _chunk_rows(x_ptr, w_ptr, rows, cols, k_lo, k_hi, stride_x, stride_w,
                BR: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                IEEE: tl.constexpr):
    """fp32 [BR, BC] = sum over k in [k_lo, k_hi) of x[rows, k] * w[cols, k], BK steps in K order.
    `rows`/`cols` are already clamped into range (out-of-range tiles reload valid rows; the store masks)."""
    return _chain_rows(tl.zeros((BR, BC), dtype=tl.float32), x_ptr, w_ptr, rows, cols, k_lo, k_hi, stride_x,
                       stride_w, BK, EVEN_K, IEEE)


@jit
def _chain_rows(acc, x_ptr, w_ptr, rows, cols, k_lo, k_hi, stride_x, stride_w, BK: tl.constexpr,
                EVEN_K: tl.constexpr, IEEE: tl.constexpr):
    """`_chunk_rows` onto the fp32 accumulator `acc` [BR, BC] instead of zero: the chain runs on."""
    offs_k = tl.arange(0, BK)
    for k0 in range(k_lo, k_hi, BK):
        ks = k0 + offs_k
        a_ptrs = x_ptr + rows[:, None] * stride_x + ks[None, :]
        b_ptrs = w_ptr + cols[None, :] * stride_w + ks[:, None]
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:  # a short last step is zero-padded: the padding adds exact zeros
            a = tl.load(a_ptrs, mask=ks[None, :] < k_hi, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < k_hi, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    return acc


@jit
def _chunk_tree(x_ptr, w_ptr, rows, cols, KC, stride_x, stride_w, C: tl.constexpr,
                BR: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                IEEE: tl.constexpr, FOLD: tl.constexpr):
    """All C chunk sums of one tile, combined in registers (C in 1, 2, 4, 8): FOLD, in chunk order
    (((c0 + c1) + c2) + ...: two accumulators live), else by the pairwise tree."""
    if FOLD:
        tot = _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        for c in tl.static_range(1, C):
            tot = tot + _chunk_rows(x_ptr, w_ptr, rows, cols, c * KC, (c + 1) * KC, stride_x, stride_w,
                                    BR, BC, BK, EVEN_K, IEEE)
    elif C == 1:
        tot = _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
    elif C == 2:
        c0 = _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c1 = _chunk_rows(x_ptr, w_ptr, rows, cols, KC, 2 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        tot = c0 + c1
    elif C == 4:
        c0 = _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c1 = _chunk_rows(x_ptr, w_ptr, rows, cols, KC, 2 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        s01 = c0 + c1
        c2 = _chunk_rows(x_ptr, w_ptr, rows, cols, 2 * KC, 3 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c3 = _chunk_rows(x_ptr, w_ptr, rows, cols, 3 * KC, 4 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        tot = s01 + (c2 + c3)
    else:  # C == 8: ((c0+c1)+(c2+c3)) + ((c4+c5)+(c6+c7))
        c0 = _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c1 = _chunk_rows(x_ptr, w_ptr, rows, cols, KC, 2 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        s01 = c0 + c1
        c2 = _chunk_rows(x_ptr, w_ptr, rows, cols, 2 * KC, 3 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c3 = _chunk_rows(x_ptr, w_ptr, rows, cols, 3 * KC, 4 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        s03 = s01 + (c2 + c3)
        c4 = _chunk_rows(x_ptr, w_ptr, rows, cols, 4 * KC, 5 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c5 = _chunk_rows(x_ptr, w_ptr, rows, cols, 5 * KC, 6 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        s45 = c4 + c5
        c6 = _chunk_rows(x_ptr, w_ptr, rows, cols, 6 * KC, 7 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        c7 = _chunk_rows(x_ptr, w_ptr, rows, cols, 7 * KC, 8 * KC, stride_x, stride_w, BR, BC, BK, EVEN_K, IEEE)
        tot = s03 + (s45 + (c6 + c7))
    return tot


@jit
def _tree_load(ws_ptr, offs, mask, MN, C: tl.constexpr, FOLD: tl.constexpr):
    """The C fp32 partials stored at ws[c * MN + offs] added in chunk order (FOLD) or by the pairwise
    tree (L2 loads: other SMs wrote them)."""
    MN = tl.full([], 0, tl.int64) + MN  # int64: C * M * N can pass 2^31
    p0 = tl.load(ws_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    p1 = tl.load(ws_ptr + MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
    tot = p0 + p1
    if FOLD:
        for c in tl.static_range(2, C):
            tot = tot + tl.load(ws_ptr + c * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
    elif C >= 4:
        p2 = tl.load(ws_ptr + 2 * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        p3 = tl.load(ws_ptr + 3 * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tot = tot + (p2 + p3)
    if C == 8:
        p4 = tl.load(ws_ptr + 4 * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        p5 = tl.load(ws_ptr + 5 * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        p6 = tl.load(ws_ptr + 6 * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        p7 = tl.load(ws_ptr + 7 * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tot = tot + ((p4 + p5) + (p6 + p7))
    return tot


@jit
def _arrive_and_combine(part, chunk, ws_ptr, ws_offs, mask, MN, cnt_ptr, y_ptr, y_offs,
                        C: tl.constexpr, FOLD: tl.constexpr):
    """Store this chunk's fp32 partial; the last of the C programs of the tile adds all C in the tree
    and writes the rounded result. The counter is reset by that program, ready for the next launch.
    Ordering: a CTA barrier, then one release/acquire atomic at GPU scope (the pattern of CUTLASS's
    semaphore), then L2 loads of the partials."""
    tl.store(ws_ptr + (tl.full([], 0, tl.int64) + MN) * chunk + ws_offs, part, mask=mask)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == C - 1:
        tot = _tree_load(ws_ptr, ws_offs, mask, MN, C, FOLD)
        tl.store(y_ptr + y_offs, tot.to(y_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


@jit(do_not_specialize=["M"])
def _gemm_swapped_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, KC, stride_x, stride_w, stride_y,
                         C: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                         EVEN_K: tl.constexpr, IEEE: tl.constexpr, FOLD: tl.constexpr):
    """Decode GEMM: program (n tile, chunk, token tile) computes w[n tile] . x[tokens]^T over one chunk."""
    pid_n = tl.program_id(0)
    chunk = tl.program_id(1)
    pid_t = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_t = pid_t * BT + tl.arange(0, BT)
    cols_w = offs_n % N
    rows_x = offs_t % M
    k_lo = chunk * KC
    part = _chunk_rows(w_ptr + k_lo, x_ptr + k_lo, cols_w, rows_x, 0, KC, stride_w, stride_x,
                       BN, BT, BK, EVEN_K, IEEE)  # [BN, BT]
    mask = (offs_n[:, None] < N) & (offs_t[None, :] < M)
    y_offs = offs_t[None, :].to(tl.int64) * stride_y + offs_n[:, None]
    if C == 1:
        tl.store(y_ptr + y_offs, part.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tile = pid_t * tl.num_programs(0) + pid_n
        _arrive_and_combine(part, chunk, ws_ptr, offs_t[None, :].to(tl.int64) * N + offs_n[:, None], mask,
                            (tl.full([], 0, tl.int64) + M) * N, cnt_ptr + tile, y_ptr, y_offs, C, FOLD)


@jit(do_not_specialize=["M"])
def _gemm_continue_kernel(x_ptr, w_ptr, start_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                          BN: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                          IEEE: tl.constexpr):
    """The chained merge's TP continuation (contract v6): y = start + x @ w.T where the tensor-core chain
    starts from the fp32 running sum `start` [M, N] (what the ranks before this one summed) instead of
    zero, so rank r's steps extend ranks 0..r-1's chain exactly as one program over the whole K does.
    Swapped tiles (weights the MMA's row operand, [BN, BT] accumulators) at every M."""
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_t = pid_t * BT + tl.arange(0, BT)
    mask = (offs_n[:, None] < N) & (offs_t[None, :] < M)
    acc = tl.load(start_ptr + offs_t[None, :].to(tl.int64) * N + offs_n[:, None], mask=mask, other=0.0)
    acc = _chain_rows(acc, w_ptr, x_ptr, offs_n % N, offs_t % M, 0, K, stride_w, stride_x, BK, EVEN_K, IEEE)
    tl.store(y_ptr + offs_t[None, :].to(tl.int64) * stride_y + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=mask)


@jit
def _grouped_tile(tile, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile `tile` in grouped order (GROUP_M row tiles share a sweep over the columns, so a weight tile
    is reused from L2): its row and column offsets, the clamped rows/cols to load, the store mask."""
    n_m = tl.cdiv(M, BM)
    width = GROUP_M * tl.cdiv(N, BN)
    first_m = (tile // width) * GROUP_M
    group_rows = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % group_rows
    pid_n = (tile % width) // group_rows
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    return offs_m, offs_n, offs_m % M, offs_n % N, mask


@jit(do_not_specialize=["M"])
def _gemm_tiles_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, KC, stride_x, stride_w, stride_y,
                       C: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
                       FOLD: tl.constexpr):
    """Prefill/training GEMM over [BM x BN] tiles (grouped order so a weight tile is reused from L2)."""
    pid = tl.program_id(0)
    offs_m, offs_n, rows, cols, mask = _grouped_tile(pid, M, N, BM, BN, GROUP_M)
    y_offs = offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :]
    if SPLIT:
        chunk = tl.program_id(1)
        k_lo = chunk * KC
        part = _chunk_rows(x_ptr + k_lo, w_ptr + k_lo, rows, cols, 0, KC, stride_x, stride_w,
                           BM, BN, BK, EVEN_K, IEEE)
        _arrive_and_combine(part, chunk, ws_ptr, offs_m[:, None].to(tl.int64) * N + offs_n[None, :], mask,
                            (tl.full([], 0, tl.int64) + M) * N, cnt_ptr + pid, y_ptr, y_offs, C, FOLD)
    else:
        tot = _chunk_tree(x_ptr, w_ptr, rows, cols, KC, stride_x, stride_w, C, BM, BN, BK, EVEN_K, IEEE, FOLD)
        tl.store(y_ptr + y_offs, tot.to(y_ptr.dtype.element_ty), mask=mask)


@jit
def _stash_load(slot, loc):
    """Read back this program's own stash (after a CTA barrier: another thread of the CTA may have
    written an element, in another register layout)."""
    tl.debug_barrier()
    return tl.load(slot + loc, cache_modifier=".cg")


@jit
def _stash_store(slot, loc, value):
    tl.debug_barrier()  # every thread has read the slot's old values before anyone overwrites them
    tl.store(slot + loc, value)


@jit
def _grouped_origin(tile, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """First row and column of tile `tile` in grouped order (as `_grouped_tile`)."""
    n_m = tl.cdiv(M, BM)
    width = GROUP_M * tl.cdiv(N, BN)
    first_m = (tile // width) * GROUP_M
    group_rows = tl.minimum(n_m - first_m, GROUP_M)
    return (first_m + (tile % width) % group_rows) * BM, ((tile % width) // group_rows) * BN


@jit
def _tma_chain(x_desc, w_desc, off_m, off_n, k_lo, KC, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """fp32 [BM, BN] = sum over k in [k_lo, k_lo + KC) of x[off_m + i, k] * w[off_n + j, k]: one
    accumulator from zero, BK-wide steps in K order (TMA loads; rows and columns past the tensor's edge
    come back as zeros and are never stored)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_lo, k_lo + KC, BK):
        a = x_desc.load([off_m, k0])
        b = w_desc.load([off_n, k0])
        acc = tl.dot(a, b.T, acc)
    return acc


@jit
def _tma_tree(x_desc, w_desc, off_m, off_n, KC, s0, s1, loc, C: tl.constexpr, STASH: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr):
    """The C chunk sums of one tile (C in 1, 2, 4) added in the pairwise tree ((c0 + c1) + (c2 + c3)).
    Where the tree's pending operands wait (the order of additions is the same in every form):
    STASH = 0: in registers (C = 4: three accumulators live while c3 is summed); STASH = 1: (c0 + c1) in
    this program's fp32 slot s0 (two live); STASH = 2: every pending operand in slots s0/s1 (one
    accumulator live while a chunk is summed). FOLD (contract gemm.chunk_merge = "sequential"): the chunk
    sums are added in chunk order, (((c0 + c1) + c2) + c3), so two accumulators are live at most and
    nothing waits in a slot (STASH is not read). One pipelined loop a chunk: the MMAs overlap, the
    pipeline drains at each chunk's end (one loop over all chunks waited for every MMA and ran at
    0.33-0.60 of cuBLAS against 0.65-0.90: lab/LOG.md 2026-12-01 session 5)."""
    if FOLD:
        tot = _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK)
        for c in tl.static_range(1, C):
            tot = tot + _tma_chain(x_desc, w_desc, off_m, off_n, c * KC, KC, BM, BN, BK)
    elif C == 1:
        tot = _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK)
    elif C == 2:
        if STASH == 2:
            _stash_store(s0, loc, _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK))
            c1 = _tma_chain(x_desc, w_desc, off_m, off_n, KC, KC, BM, BN, BK)
            tot = _stash_load(s0, loc) + c1
        else:
            c0 = _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK)
            tot = c0 + _tma_chain(x_desc, w_desc, off_m, off_n, KC, KC, BM, BN, BK)
    elif STASH == 0:
        c0 = _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK)
        s01 = c0 + _tma_chain(x_desc, w_desc, off_m, off_n, KC, KC, BM, BN, BK)
        c2 = _tma_chain(x_desc, w_desc, off_m, off_n, 2 * KC, KC, BM, BN, BK)
        tot = s01 + (c2 + _tma_chain(x_desc, w_desc, off_m, off_n, 3 * KC, KC, BM, BN, BK))
    elif STASH == 1:
        c0 = _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK)
        _stash_store(s0, loc, c0 + _tma_chain(x_desc, w_desc, off_m, off_n, KC, KC, BM, BN, BK))
        c2 = _tma_chain(x_desc, w_desc, off_m, off_n, 2 * KC, KC, BM, BN, BK)
        c23 = c2 + _tma_chain(x_desc, w_desc, off_m, off_n, 3 * KC, KC, BM, BN, BK)
        tot = _stash_load(s0, loc) + c23
    else:
        _stash_store(s0, loc, _tma_chain(x_desc, w_desc, off_m, off_n, 0, KC, BM, BN, BK))
        c1 = _tma_chain(x_desc, w_desc, off_m, off_n, KC, KC, BM, BN, BK)
        _stash_store(s0, loc, _stash_load(s0, loc) + c1)                        # c0 + c1
        _stash_store(s1, loc, _tma_chain(x_desc, w_desc, off_m, off_n, 2 * KC, KC, BM, BN, BK))
        c3 = _tma_chain(x_desc, w_desc, off_m, off_n, 3 * KC, KC, BM, BN, BK)
        c23 = _stash_load(s1, loc) + c3                                          # c2 + c3
        tot = _stash_load(s0, loc) + c23
    return tot


@jit(do_not_specialize=["M", "programs"])
def _gemm_tma_kernel(x_desc, w_desc, y_ptr, ws_ptr, cnt_ptr, M, N, KC, stride_y, programs,
                     C: tl.constexpr, SPLIT: tl.constexpr, STASH: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, FOLD: tl.constexpr):
    """Hopper GEMM by TMA tiles. SPLIT=False: a persistent grid of `programs`, each walking the output
    tiles pid, pid + programs, ... in grouped order and adding a tile's C chunk sums in registers.
    SPLIT=True (few tiles, C > 1): program (tile, chunk) sums one chunk; the last of a tile's C programs
    adds the C fp32 partials in the tree (`_arrive_and_combine`). Same chains, same tree: same bits.
    STASH > 0 (SPLIT=False, C > 1): the program's two fp32 slots of BM x BN are ws[pid] (see _tma_tree)."""
    if SPLIT:
        tile = tl.program_id(0)
        chunk = tl.program_id(1)
        off_m, off_n = _grouped_origin(tile, M, N, BM, BN, GROUP_M)
        part = _tma_chain(x_desc, w_desc, off_m, off_n, chunk * KC, KC, BM, BN, BK)
        offs_m = off_m + tl.arange(0, BM)
        offs_n = off_n + tl.arange(0, BN)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        _arrive_and_combine(part, chunk, ws_ptr, offs_m[:, None].to(tl.int64) * N + offs_n[None, :], mask,
                            (tl.full([], 0, tl.int64) + M) * N, cnt_ptr + tile, y_ptr,
                            offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], C, FOLD)
    else:
        tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
        loc = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        s0 = ws_ptr + tl.program_id(0).to(tl.int64) * (2 * BM * BN)
        s1 = s0 + BM * BN
        for tile in tl.range(tl.program_id(0), tiles, programs, flatten=False):
            off_m, off_n = _grouped_origin(tile, M, N, BM, BN, GROUP_M)
            tot = _tma_tree(x_desc, w_desc, off_m, off_n, KC, s0, s1, loc, C, STASH, BM, BN, BK, FOLD)
            offs_m = off_m + tl.arange(0, BM)
            offs_n = off_n + tl.arange(0, BN)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :],
                     tot.to(y_ptr.dtype.element_ty), mask=mask)


@jit
def _flat_chunk_end(acc, pend, s01, chunk, slot, y_desc, off_m, off_n, C: tl.constexpr, STASH: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, FOLD: tl.constexpr):
    """The tree step at the end of chunk `chunk` of a tile (the flat kernel): the same grouping as
    `_tma_tree`, ((c0 + c1) + (c2 + c3)) for C = 4, with the pending operands where STASH puts them
    (0: `pend` and `s01` in registers; 1: `pend` in registers, (c0 + c1) in this program's fp32 slot 0;
    2: every pending operand in slots 0 and 1). The last chunk stores the rounded tile by TMA (rows and
    columns past the tensor's edge are not written). FOLD: `pend` is the running sum of the chunks so
    far, in chunk order (STASH is not read). Returns the new (pend, s01)."""
    loc = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    if FOLD and C > 1:
        if chunk == 0:
            pend = acc
        elif chunk == C - 1:
            y_desc.store([off_m, off_n], (pend + acc).to(y_desc.dtype))
        else:
            pend = pend + acc
    elif C == 1:
        y_desc.store([off_m, off_n], acc.to(y_desc.dtype))
    elif C == 2:
        if chunk == 1:
            if STASH == 2:
                tot = _stash_load(slot, loc) + acc
            else:
                tot = pend + acc
            y_desc.store([off_m, off_n], tot.to(y_desc.dtype))
        elif STASH == 2:
            _stash_store(slot, loc, acc)
        else:
            pend = acc
    else:  # C == 4
        if chunk == 0:
            if STASH == 2:
                _stash_store(slot, loc, acc)
            else:
                pend = acc
        elif chunk == 1:
            if STASH == 0:
                s01 = pend + acc
            elif STASH == 1:
                _stash_store(slot, loc, pend + acc)
            else:
                _stash_store(slot, loc, _stash_load(slot, loc) + acc)
        elif chunk == 2:
            if STASH == 2:
                _stash_store(slot + BM * BN, loc, acc)
            else:
                pend = acc
        else:
            if STASH == 0:
                tot = s01 + (pend + acc)
            elif STASH == 1:
                tot = _stash_load(slot, loc) + (pend + acc)
            else:
                tot = _stash_load(slot, loc) + (_stash_load(slot + BM * BN, loc) + acc)
            y_desc.store([off_m, off_n], tot.to(y_desc.dtype))
    return pend, s01


@jit(do_not_specialize=["M", "programs"])
def _gemm_tma_flat_kernel(x_desc, w_desc, y_desc, ws_ptr, M, N, KC, programs,
                          C: tl.constexpr, STASH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, GROUP_M: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                          FOLD: tl.constexpr):
    """The TMA kernel's persistent form as one flat loop over (tile, chunk, K step): the loads of the next
    chunk and the next tile are in flight while a chunk ends, where the nested form (`_gemm_tma_kernel`)
    drains its pipeline at every chunk boundary (four times a tile for the row-parallel tree). Each chunk
    is still one chain from zero in K order (the accumulator is zeroed at the chunk's end), and the chunk
    sums meet in the same tree (`_flat_chunk_end`): the same bits as every other form. WARP_SPECIALIZE:
    Triton's warp-specialized loop (producer warps issue the TMA loads, consumers the MMAs)."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    steps = KC // BK
    my_tiles = tl.cdiv(tiles - pid, programs)
    slot = ws_ptr + pid.to(tl.int64) * (2 * BM * BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    pend = tl.zeros((BM, BN), dtype=tl.float32)
    s01 = tl.zeros((BM, BN), dtype=tl.float32)
    for it in tl.range(0, my_tiles * C * steps, warp_specialize=WARP_SPECIALIZE):
        step = it % steps
        chunk = (it // steps) % C
        off_m, off_n = _grouped_origin(pid + (it // (steps * C)) * programs, M, N, BM, BN, GROUP_M)
        k0 = chunk * KC + step * BK
        a = x_desc.load([off_m, k0])
        b = w_desc.load([off_n, k0])
        if FOLD:  # reset before the chunk's first step (measured: fewer registers than after its last)
            acc = tl.where(step == 0, 0.0, acc)
        acc = tl.dot(a, b.T, acc)
        if step == steps - 1:
            pend, s01 = _flat_chunk_end(acc, pend, s01, chunk, slot, y_desc, off_m, off_n, C, STASH, BM, BN,
                                        FOLD)
            if not FOLD:
                acc = tl.zeros((BM, BN), dtype=tl.float32)
