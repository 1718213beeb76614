"""Strict GEMM: y = x @ w.T with the contract's canonical K reduction.

Contract (GemmSpec): K is cut into `k_chunks` equal contiguous chunks; each chunk's partial sum is fp32;
the partials merge in the canonical pairwise tree (kernels/tree.py) in fp32; the result is rounded once.

CPU reference: each chunk partial comes from the backend's fp32 GEMM, but every call has exactly
`row_tile` rows (padded with zero rows), so the backend's blocking, and therefore each row's order of
additions inside a chunk, is the same whether the row is alone or in a batch of 8192. Measured on this
machine's MKL: a plain `x @ w.T` gives different bits for a row alone and the same row in any batch of 2
or more; the fixed-tile calls give identical bits (tests/kernels/test_gemm.py).

Row-parallel tensor parallelism: a rank holding K/tp of the columns computes the subtree of its
k_chunks/tp chunks with `partial(...)`; `rlkit.kernels.collectives.reference` gathers the per-rank fp32
partials and combines the top levels of the same tree, so TP 1, 2 and 4 give the same bits.

GPU: the Triton kernels at the end of this file run the same contract on tensor cores for CUDA tensors
(`strict(...)` picks them; `rlkit.ops.linear` calls `strict`). They read `gemm.k_chunks`, `gemm.k_tile` and
`gpu.fp_fusion`, and cover k_chunks / shards in TREE_CHUNKS (1, 2, 4, 8; the tree is unrolled); other
chunk counts run the reference, which defines the contract. `triton_launch` returns what it launched
(plan and compiled kernel) to the caller that asks, the benchmarks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from rlkit.contract import NumericsContract
from rlkit.kernels.errors import OpInputError, check_dims, check_float, check_same
from rlkit.kernels.tree import pairwise_sum

OP = "linear"


def check_inputs(x: torch.Tensor, w: torch.Tensor) -> None:
    check_float(OP, "x", x)
    check_float(OP, "w", w)
    check_same(OP, x=x, w=w)
    check_dims(OP, "w", w, 2, "[out_features, in_features]")
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise OpInputError(
            OP, f"x has shape {tuple(x.shape)} and w has shape {tuple(w.shape)}; expected x [..., K] "
            f"with K = w.shape[1] = {w.shape[1]}")


def _chunk_bounds(k: int, chunks: int, contract: NumericsContract) -> list[tuple[int, int]]:
    if k % chunks:
        raise OpInputError(
            OP, f"K={k} is not divisible into {chunks} equal chunks (contract gemm.k_chunks="
            f"{contract.gemm.k_chunks}); strict GEMM needs K to be a multiple of the chunk count")
    size = k // chunks
    return [(c * size, (c + 1) * size) for c in range(chunks)]


def _tile_rows(x2d: torch.Tensor, row_tile: int) -> tuple[torch.Tensor, int]:
    """Pad rows to a whole number of tiles (zero rows never mix with real rows in a GEMM)."""
    m = x2d.shape[0]
    pad = (-m) % row_tile
    if pad:
        x2d = torch.cat([x2d, x2d.new_zeros(pad, x2d.shape[1])])
    return x2d, m


# Inference reuses the same weights every step: their fp32 chunk copies are kept per weight tensor, held
# weakly (an entry dies with its tensor), and rebuilt when the tensor changes in place (its version
# counter or storage moves) or the chunk bounds differ: the entry records all three. Never used when
# autograd needs the graph back to the weight. A cache hit and a miss give the same bits (a copy).
_WEIGHT_CHUNKS: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""weight tensor (weakly, by identity) -> ((version, data_ptr, bounds), fp32 chunk copies)."""


def _weight_chunks(w: torch.Tensor, bounds: list[tuple[int, int]]) -> list[torch.Tensor]:
    cacheable = not (torch.is_grad_enabled() and w.requires_grad)
    key = (w._version, w.data_ptr(), tuple(bounds))
    if cacheable:
        hit = _WEIGHT_CHUNKS.get(w)
        if hit is not None and hit[0] == key:
            return hit[1]
    wf = w.float()
    chunks = [wf[:, lo:hi].contiguous() for lo, hi in bounds]
    # a chunk that is w itself (fp32, one chunk spanning K) saves nothing and, as a view, would keep its
    # key alive: only copies are cached
    if cacheable and all(c.untyped_storage().data_ptr() != w.untyped_storage().data_ptr() for c in chunks):
        _WEIGHT_CHUNKS[w] = (key, chunks)
    return chunks


def partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1) -> torch.Tensor:
    """fp32 partial sum of this shard's K range: the tree over its k_chunks/shards chunks, unrounded.

    With shards=1 (the whole K) this is the full fp32 result before its single rounding.
    """
    check_inputs(x, w)
    chunks_total = contract.gemm.k_chunks
    if shards < 1 or chunks_total % shards:
        raise OpInputError(
            OP, f"{shards} row-parallel shards do not divide gemm.k_chunks={chunks_total}; use a TP size "
            f"that divides it (or a contract with more chunks)")
    bounds = _chunk_bounds(w.shape[1], chunks_total // shards, contract)
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1]).float()
    tile = contract.gemm.row_tile
    padded, m = _tile_rows(x2d, tile)
    # Every operand is made contiguous in one canonical layout ([rows, kc] and [N, kc]), so a TP shard
    # (whose row stride is K/tp) hands the backend exactly what the unsharded layer does.
    w_chunks = _weight_chunks(w, bounds)
    x_chunks = [padded[:, lo:hi].contiguous() for lo, hi in bounds]
    out = torch.empty(padded.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for r in range(0, padded.shape[0], tile):
        parts = [xc[r : r + tile] @ wc.t() for xc, wc in zip(x_chunks, w_chunks)]
        out[r : r + tile] = pairwise_sum(parts)
    return out[:m].reshape(*lead, w.shape[0])


def reference(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Strict y = x @ w.T, rounded once to `out_dtype` (default: x's dtype)."""
    return partial(x, w, contract).to(out_dtype or x.dtype)


def native(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What frameworks do: one backend GEMM in the input dtype (its blocking depends on the shape)."""
    check_inputs(x, w)
    y = F.linear(x, w)
    return y if out_dtype is None else y.to(out_dtype)


# =====================================================================================================
# Triton (GPU): the same contract, on tensor cores.
#
# What fixes a product's bits on the GPU, for every M: each K chunk [c*K/C, (c+1)*K/C) is summed from
# zero by a chain of tensor-core MMAs over `k_tile`-wide steps in K order (each step is k16 MMA steps,
# accumulated in fp32 in the instruction's fixed order); the C chunk sums meet in the pairwise tree in
# fp32; one rounding to the output dtype. Every launcher below runs exactly that; they differ only in
# which program computes which tile and chunk:
# - `_gemm_swapped_kernel` (decode, M <= 64): weights are the MMA's row operand (swap-AB), tokens its
#   column operand, and the grid runs over N tiles x K chunks, so the weights stream at full bandwidth
#   even for one token; the last of a tile's C programs to arrive (an atomic counter) loads the C fp32
#   partials and adds them in the tree;
# - `_gemm_tiles_kernel` (M > 64): [BM x BN] output tiles; either one program walks the C chunks and
#   adds them in registers in the tree (SPLIT=False), or, when there are too few tiles to fill the GPU,
#   the C chunks go to C programs that combine as above (SPLIT=True).
# Where the chunk sums meet (registers or an fp32 workspace) and the tile shape never change a value: an
# fp32 store/load is exact and fp32 addition is commutative, so only the tree's grouping matters, and
# that is fixed. tests/gpu/test_kernels_gpu.py proves it on the H200: all launch configurations give
# identical bits, a row alone equals the same row in batches on both sides of every threshold.
# =====================================================================================================
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels._triton import jit, tl  # noqa: E402

TREE_CHUNKS = (1, 2, 4, 8)
"""Chunk counts the GPU kernels implement (the tree is unrolled); others use the reference."""


@jit
def _chunk_rows(x_ptr, w_ptr, rows, cols, k_lo, k_hi, stride_x, stride_w,
                BR: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                IEEE: tl.constexpr):
    """fp32 [BR, BC] = sum over k in [k_lo, k_hi) of x[rows, k] * w[cols, k], BK steps in K order.
    `rows`/`cols` are already clamped into range (out-of-range tiles reload valid rows; the store masks)."""
    offs_k = tl.arange(0, BK)
    acc = tl.zeros((BR, BC), dtype=tl.float32)
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
                IEEE: tl.constexpr):
    """All C chunk sums of one tile, combined in registers by the pairwise tree (C in 1, 2, 4, 8)."""
    if C == 1:
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
def _tree_load(ws_ptr, offs, mask, MN, C: tl.constexpr):
    """The pairwise tree over C fp32 partials stored at ws[c * MN + offs] (L2 loads: other SMs wrote them)."""
    MN = tl.full([], 0, tl.int64) + MN  # int64: C * M * N can pass 2^31
    p0 = tl.load(ws_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    p1 = tl.load(ws_ptr + MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
    tot = p0 + p1
    if C >= 4:
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
                        C: tl.constexpr):
    """Store this chunk's fp32 partial; the last of the C programs of the tile adds all C in the tree
    and writes the rounded result. The counter is reset by that program, ready for the next launch.
    Ordering: a CTA barrier, then one release/acquire atomic at GPU scope (the pattern of CUTLASS's
    semaphore), then L2 loads of the partials."""
    tl.store(ws_ptr + (tl.full([], 0, tl.int64) + MN) * chunk + ws_offs, part, mask=mask)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == C - 1:
        tot = _tree_load(ws_ptr, ws_offs, mask, MN, C)
        tl.store(y_ptr + y_offs, tot.to(y_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


@jit
def _gemm_swapped_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, KC, stride_x, stride_w, stride_y,
                         C: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                         EVEN_K: tl.constexpr, IEEE: tl.constexpr):
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
                            (tl.full([], 0, tl.int64) + M) * N, cnt_ptr + tile, y_ptr, y_offs, C)


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


@jit
def _gemm_tiles_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, KC, stride_x, stride_w, stride_y,
                       C: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr):
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
                            (tl.full([], 0, tl.int64) + M) * N, cnt_ptr + pid, y_ptr, y_offs, C)
    else:
        tot = _chunk_tree(x_ptr, w_ptr, rows, cols, KC, stride_x, stride_w, C, BM, BN, BK, EVEN_K, IEEE)
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
def _gemm_stash_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, M, N, KC, stride_x, stride_w, stride_y,
                       C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr):
    """Prefill/training GEMM over all of K with a single live accumulator: each chunk sum is computed in
    turn and the pairwise tree's pending operands wait in this program's own fp32 stash slots (global
    memory, L2-resident; 3 slots of BM x BN a program), not in registers. Persistent: a program walks
    the tiles pid, pid + programs, ... (grouped order), so the stash is sized by the programs, not the
    tiles. The tree's grouping is the contract's: C=4 is (c0 + c1) + (c2 + c3)."""
    pid = tl.program_id(0)
    loc = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    s0 = ws_ptr + pid.to(tl.int64) * (3 * BM * BN)
    s1 = s0 + BM * BN
    s2 = s1 + BM * BN
    for tile in range(pid, tl.cdiv(M, BM) * tl.cdiv(N, BN), tl.num_programs(0)):
        _stash_tile(x_ptr, w_ptr, y_ptr, s0, s1, s2, loc, tile, M, N, KC, stride_x, stride_w, stride_y,
                    C, BM, BN, BK, GROUP_M, EVEN_K, IEEE)


@jit
def _stash_tile(x_ptr, w_ptr, y_ptr, s0, s1, s2, loc, tile, M, N, KC, stride_x, stride_w, stride_y,
                C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                EVEN_K: tl.constexpr, IEEE: tl.constexpr):
    offs_m, offs_n, rows, cols, mask = _grouped_tile(tile, M, N, BM, BN, GROUP_M)
    if C == 1:
        tot = _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
    elif C == 2:
        _stash_store(s0, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BM, BN, BK,
                                          EVEN_K, IEEE))
        c1 = _chunk_rows(x_ptr, w_ptr, rows, cols, KC, 2 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        tot = _stash_load(s0, loc) + c1
    elif C == 4:
        _stash_store(s0, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BM, BN, BK,
                                          EVEN_K, IEEE))
        c1 = _chunk_rows(x_ptr, w_ptr, rows, cols, KC, 2 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        _stash_store(s0, loc, _stash_load(s0, loc) + c1)                       # c0 + c1
        _stash_store(s1, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 2 * KC, 3 * KC, stride_x, stride_w, BM, BN,
                                          BK, EVEN_K, IEEE))
        c3 = _chunk_rows(x_ptr, w_ptr, rows, cols, 3 * KC, 4 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        tot = _stash_load(s0, loc) + (_stash_load(s1, loc) + c3)              # (c0 + c1) + (c2 + c3)
    else:  # C == 8: ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))
        _stash_store(s0, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 0, KC, stride_x, stride_w, BM, BN, BK,
                                          EVEN_K, IEEE))
        c1 = _chunk_rows(x_ptr, w_ptr, rows, cols, KC, 2 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        _stash_store(s0, loc, _stash_load(s0, loc) + c1)
        _stash_store(s1, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 2 * KC, 3 * KC, stride_x, stride_w, BM, BN,
                                          BK, EVEN_K, IEEE))
        c3 = _chunk_rows(x_ptr, w_ptr, rows, cols, 3 * KC, 4 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        _stash_store(s0, loc, _stash_load(s0, loc) + (_stash_load(s1, loc) + c3))
        _stash_store(s1, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 4 * KC, 5 * KC, stride_x, stride_w, BM, BN,
                                          BK, EVEN_K, IEEE))
        c5 = _chunk_rows(x_ptr, w_ptr, rows, cols, 5 * KC, 6 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        _stash_store(s1, loc, _stash_load(s1, loc) + c5)
        _stash_store(s2, loc, _chunk_rows(x_ptr, w_ptr, rows, cols, 6 * KC, 7 * KC, stride_x, stride_w, BM, BN,
                                          BK, EVEN_K, IEEE))
        c7 = _chunk_rows(x_ptr, w_ptr, rows, cols, 7 * KC, 8 * KC, stride_x, stride_w, BM, BN, BK, EVEN_K, IEEE)
        tot = _stash_load(s0, loc) + (_stash_load(s1, loc) + (_stash_load(s2, loc) + c7))
    y_offs = offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :]
    tl.store(y_ptr + y_offs, tot.to(y_ptr.dtype.element_ty), mask=mask)


# -- launch plans: which kernel and tile for a shape. None of these choices changes a bit (see above).
SMALL_M = 64
"""M <= SMALL_M runs the swapped (decode) kernel."""


def plan(m: int, n: int, device: torch.device, override: dict | None = None) -> dict:
    """Launch configuration for an [m, K] x [n, K]^T product, fixed per M range (measured on the H200,
    lab/KERNELS_NOTES.md; none of these choices changes a bit, tests/gpu prove it):
    - M <= 16: swapped, 128 weight rows a program (two wgmma M=64 halves, 4 warps; 64 when N/128 x 4
      chunk programs would not give every SM two), 16 token columns (the smallest wgmma N Triton
      emits), 4 stages of 64-wide K steps (~80 KB of weights in flight);
    - 16 < M <= 64: swapped, 64 weight rows x 64 tokens (one token tile, so the weights stream once);
    - M > 64: 128 x 256 tiles, 8 warps (two warpgroups, 128 fp32 accumulator registers a thread), 3
      stages (144 KB of shared memory), each K chunk in its own program (SPLIT): one accumulator a
      program; the tree of the C fp32 partials runs in the last program to arrive. Keeping the C
      chunk sums of a tile in one program's registers (SPLIT=False) needs three live accumulators and
      measured 0.3-0.4x cuBLAS; the split measured 0.5-0.8x."""
    if override:
        return dict(override)
    if m <= 16:  # 128 weight rows a program unless that leaves fewer than two programs per SM
        bn = 128 if _tr.cdiv(n, 128) * 4 >= 2 * _tr.sm_count(device) else 64
        return dict(kind="swapped", BN=bn, BT=16, num_warps=4, num_stages=4)
    if m <= SMALL_M:
        return dict(kind="swapped", BN=64, BT=64, num_warps=4, num_stages=4)
    traits = _tr.gpu_traits(device)
    if traits is not None and traits.backend == "hip":
        # MI300X (gfx942) has 64 KB of LDS a workgroup and the 128 x 256 x 3-stage tile asks 96 KB there
        # (Triton would refuse to load it): 128 x 128 tiles, 8 warps, 2 stages (32 KB, 126 VGPRs, no
        # spills; rlkit/bench/compile_targets.py checks it). Compiled in CI, never run: not tuned.
        return dict(kind="tiles", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=2)
    return dict(kind="tiles", BM=128, BN=256, GROUP_M=8, split=True, num_warps=8, num_stages=3)


WORKSPACE_BYTES = 1 << 30
"""A split launch stores C fp32 partials of its output; rows beyond this budget go in row slabs (rows
are independent, so slabs never change a bit)."""


_COUNTERS: dict[str, list[torch.Tensor]] = {}
"""str(device) -> every arrival-counter buffer handed out on it, the newest (largest) last. A buffer
outgrown by a larger launch stays in the list, never freed, because a captured CUDA graph may still
point at it. Written only when a launch needs more counters than any before it."""


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters, one per output tile; every launch leaves them zero again.
    (One buffer per device: two strict GEMMs must not run at once on different streams.)"""
    bufs = _COUNTERS.setdefault(str(device), [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device))
    return bufs[-1]


def supported(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1) -> bool:
    c = contract.gemm.k_chunks // max(shards, 1)
    return (_tr.HAVE_TRITON and c in TREE_CHUNKS and contract.gemm.k_chunks % max(shards, 1) == 0
            and w.shape[1] % c == 0 and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and x.dtype == w.dtype)


def triton_partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
                   out_dtype: torch.dtype = torch.float32, config: dict | None = None) -> torch.Tensor:
    """The Triton strict GEMM: tree over this shard's k_chunks/shards chunks, rounded once to out_dtype
    (fp32: no rounding, the `partial` semantics). x [..., K], w [N, K] (K contiguous)."""
    return triton_launch(x, w, contract, shards, out_dtype, config)[0]


def triton_launch(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
                  out_dtype: torch.dtype = torch.float32, config: dict | None = None
                  ) -> tuple[torch.Tensor, list[_tr.Launch]]:
    """`triton_partial` and what it launched: one `Launch` (kernel, plan, compiled stats) a kernel call."""
    check_inputs(x, w)
    launches: list[_tr.Launch] = []
    c = contract.gemm.k_chunks // shards
    k = w.shape[1]
    if k % c:
        _chunk_bounds(k, c, contract)  # raises the reference's error
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    m, n = x2.shape[0], w.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n), launches
    kc = k // c
    bk = contract.gemm.k_tile
    cfg = plan(m, n, x.device, config)
    ieee = x.dtype == torch.float32
    even_k = kc % bk == 0
    opts = _tr.launch_options(contract)
    if cfg["kind"] == "swapped":
        grid = (_tr.cdiv(n, cfg["BN"]), c, _tr.cdiv(m, cfg["BT"]))
        ws = torch.empty(c * m * n if c > 1 else 1, dtype=torch.float32, device=x.device)
        cnt = _counters(x.device, grid[0] * grid[2])
        compiled = _gemm_swapped_kernel[grid](x2, w, y, ws, cnt, m, n, kc, x2.stride(0), w.stride(0), y.stride(0),
                                              C=c, BN=cfg["BN"], BT=cfg["BT"], BK=bk, EVEN_K=even_k, IEEE=ieee,
                                              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
        launches.append(_tr.Launch("swapped", dict(cfg, grid=grid, C=c, BK=bk), compiled))
    elif cfg["kind"] == "stash":
        tiles = _tr.cdiv(m, cfg["BM"]) * _tr.cdiv(n, cfg["BN"])
        programs = min(tiles, cfg.get("programs_per_sm", 1) * _tr.sm_count(x.device))
        ws = torch.empty(programs * 3 * cfg["BM"] * cfg["BN"] if c > 1 else 1, dtype=torch.float32,
                         device=x.device)
        compiled = _gemm_stash_kernel[(programs,)](
            x2, w, y, ws, m, n, kc, x2.stride(0), w.stride(0), y.stride(0), C=c, BM=cfg["BM"], BN=cfg["BN"],
            BK=bk, GROUP_M=cfg["GROUP_M"], EVEN_K=even_k, IEEE=ieee, num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], **opts)
        launches.append(_tr.Launch("stash", dict(cfg, grid=(programs,), C=c, BK=bk), compiled))
    else:
        split = bool(cfg["split"]) and c > 1
        slab = m
        if split and c * m * n * 4 > WORKSPACE_BYTES:
            slab = max(cfg["BM"], WORKSPACE_BYTES // (c * n * 4) // cfg["BM"] * cfg["BM"])
        for lo in range(0, m, slab):
            xs, ys = x2[lo : lo + slab], y[lo : lo + slab]
            ms = xs.shape[0]
            tiles = _tr.cdiv(ms, cfg["BM"]) * _tr.cdiv(n, cfg["BN"])
            grid = (tiles, c if split else 1)
            ws = torch.empty(c * ms * n if split else 1, dtype=torch.float32, device=x.device)
            cnt = _counters(x.device, tiles)
            compiled = _gemm_tiles_kernel[grid](
                xs, w, ys, ws, cnt, ms, n, kc, xs.stride(0), w.stride(0), ys.stride(0), C=c, SPLIT=split,
                BM=cfg["BM"], BN=cfg["BN"], BK=bk, GROUP_M=cfg["GROUP_M"], EVEN_K=even_k, IEEE=ieee,
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
            launches.append(_tr.Launch("tiles", dict(cfg, grid=grid, C=c, BK=bk, split=split), compiled))
    return y.reshape(*lead, n), launches


# -- the strict entry points rlkit.ops calls ------------------------------------------------------------
class _StrictLinear(torch.autograd.Function):
    """Forward: the strict GEMM (Triton on CUDA, the reference elsewhere). Backward: native products in
    the model dtype (gradients need not be bitwise; only the forward's logprobs are compared)."""

    @staticmethod
    def forward(ctx, x, w, contract, out_dtype):
        ctx.save_for_backward(x, w)
        if _tr.on_gpu(x, w) and supported(x, w, contract):
            return triton_partial(x, w, contract, 1, out_dtype or x.dtype)
        return reference(x, w, contract, out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        g = grad.to(x.dtype)
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = (g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        return gx, gw, None, None


def strict(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Strict y = x @ w.T: the Triton kernel for CUDA tensors, the reference otherwise; under autograd
    the same forward with a native backward."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return _StrictLinear.apply(x, w, contract, out_dtype)
    if _tr.on_gpu(x, w) and supported(x, w, contract):
        return triton_partial(x, w, contract, 1, out_dtype or x.dtype)
    return reference(x, w, contract, out_dtype)


def strict_partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1) -> torch.Tensor:
    """fp32 subtree partial of a row-parallel shard (forward only on the GPU path)."""
    if _tr.on_gpu(x, w) and supported(x, w, contract, shards) and not (
            torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        if shards < 1 or contract.gemm.k_chunks % shards:
            return partial(x, w, contract, shards)  # raises the reference's error
        return triton_partial(x, w, contract, shards, torch.float32)
    return partial(x, w, contract, shards)
