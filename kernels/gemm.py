"""Strict GEMM: y = x @ w.T with the contract's canonical K reduction.

Contract (GemmSpec): K is cut into `chunk_count(contract, row_parallel)` equal contiguous chunks (`k_chunks` for
the row-parallel layers, whose K tensor parallelism splits; `column_k_chunks` for every other GEMM); each
chunk's partial sum is fp32; the partials merge in fp32 by `gemm.chunk_merge` (in chunk order from version
5, ((c0 + c1) + c2) + c3; the canonical pairwise tree of kernels/tree.py before); the result is rounded once.
With one chunk the sum is one fp32 chain over K in K order.

CPU reference: each chunk partial comes from the backend's fp32 GEMM, but every call has exactly
`row_tile` rows (padded with zero rows), so the backend's blocking, and therefore each row's order of
additions inside a chunk, is the same whether the row is alone or in a batch of 8192. Measured on this
machine's MKL: a plain `x @ w.T` gives different bits for a row alone and the same row in any batch of 2
or more; the fixed-tile calls give identical bits (tests/kernels/test_gemm.py).

Row-parallel tensor parallelism: a rank holding K/tp of the columns computes `shard_partials(...)`: the
fp32 pieces of the merge it can finish alone (the subtree of its k_chunks/tp chunks under the pairwise
tree; each of its chunk partials under the sequential merge, whose running sum crosses the ranks); the
ranks gather them in rank order (`rlkit.kernels.collectives.gather`) and `merge_partials` finishes the
same merge, so TP 1, 2 and 4 give the same bits.

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
from rlkit.kernels.tree import pairwise_sum, sequential_sum

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


def chunk_count(contract: NumericsContract, row_parallel: bool) -> int:
    """K chunks of a row-parallel layer (gemm.k_chunks: TP splits its K) or of any other GEMM
    (gemm.column_k_chunks; None, as in contract versions 1 and 2: the same as gemm.k_chunks)."""
    spec = contract.gemm
    if row_parallel or spec.column_k_chunks is None:
        return spec.k_chunks
    return spec.column_k_chunks


def _chunk_bounds(k: int, chunks: int, contract: NumericsContract, row_parallel: bool) -> list[tuple[int, int]]:
    if k % chunks:
        field = "k_chunks" if row_parallel or contract.gemm.column_k_chunks is None else "column_k_chunks"
        raise OpInputError(
            OP, f"K={k} is not divisible into {chunks} equal chunks (contract gemm.{field}="
            f"{chunk_count(contract, row_parallel)}); strict GEMM needs K to be a multiple of the chunk count")
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


def _check_shards(contract: NumericsContract, shards: int, row_parallel: bool) -> int:
    """The chunk count of the whole K; refuses a shard count the tree cannot split evenly."""
    chunks_total = chunk_count(contract, row_parallel)
    if shards > 1 and not row_parallel:
        raise OpInputError(OP, f"{shards} K shards of a column-parallel GEMM: only row-parallel layers "
                               f"split K over ranks")
    if shards < 1 or chunks_total % shards:
        raise OpInputError(
            OP, f"{shards} row-parallel shards do not divide gemm.k_chunks={chunks_total}; use a TP size "
            f"that divides it (or a contract with more chunks)")
    return chunks_total


def merge(parts, contract: NumericsContract) -> torch.Tensor:
    """The fp32 chunk partials (or shard pieces) of one product, in K order, merged as `gemm.chunk_merge`
    says: added in order ("sequential") or by the canonical pairwise tree. `parts` is a sequence of
    tensors or one tensor whose first dimension runs over them."""
    items = list(parts.unbind(0)) if isinstance(parts, torch.Tensor) else list(parts)
    if contract.gemm.chunk_merge == "sequential":
        return sequential_sum(items)
    return pairwise_sum(items)


def pieces_per_shard(contract: NumericsContract, shards: int, row_parallel: bool = True) -> int:
    """How many fp32 pieces a TP shard contributes to the merge: its subtree (1) under the pairwise tree,
    each of its chunks under the sequential merge (whose running sum crosses the shards)."""
    chunks = _check_shards(contract, shards, row_parallel) // shards
    return chunks if contract.gemm.chunk_merge == "sequential" and shards > 1 else 1


def shard_partials(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
                   row_parallel: bool = False) -> torch.Tensor:
    """[pieces, ..., N] fp32: what this shard's K range contributes to the merge, unrounded
    (`pieces_per_shard`; `row_parallel`: the layer's chunk count is gemm.k_chunks, else
    gemm.column_k_chunks). `merge` over every shard's pieces in rank order gives `partial(x, w)` of the
    whole K; with shards=1 the one piece is that full fp32 result before its single rounding."""
    check_inputs(x, w)
    chunks_total = _check_shards(contract, shards, row_parallel)
    bounds = _chunk_bounds(w.shape[1], chunks_total // shards, contract, row_parallel)
    pieces = pieces_per_shard(contract, shards, row_parallel)
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1]).float()
    tile = contract.gemm.row_tile
    padded, m = _tile_rows(x2d, tile)
    # Every operand is made contiguous in one canonical layout ([rows, kc] and [N, kc]), so a TP shard
    # (whose row stride is K/tp) hands the backend exactly what the unsharded layer does.
    w_chunks = _weight_chunks(w, bounds)
    x_chunks = [padded[:, lo:hi].contiguous() for lo, hi in bounds]
    out = torch.empty(pieces, padded.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for r in range(0, padded.shape[0], tile):
        parts = [xc[r : r + tile] @ wc.t() for xc, wc in zip(x_chunks, w_chunks)]
        if pieces == 1:
            out[0, r : r + tile] = merge(parts, contract)
        else:
            out[:, r : r + tile] = torch.stack(parts)
    return out[:, :m].reshape(pieces, *lead, w.shape[0])


def partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, row_parallel: bool = False) -> torch.Tensor:
    """fp32 y = x @ w.T before its single rounding: every chunk, merged."""
    return shard_partials(x, w, contract, 1, row_parallel)[0]


def reference(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
              out_dtype: torch.dtype | None = None, row_parallel: bool = False) -> torch.Tensor:
    """Strict y = x @ w.T, rounded once to `out_dtype` (default: x's dtype)."""
    return partial(x, w, contract, row_parallel).to(out_dtype or x.dtype)


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
# - `_gemm_tma_kernel` (M > 64 on Hopper, bf16/fp16): a persistent grid of [BM x BN] tiles loaded by
#   TMA; a tile's C chunk sums meet in registers or, for C = 4, with (c0 + c1) parked in the program's
#   own fp32 slot (two accumulators live instead of three); with too few tiles, the C chunks go to C
#   programs that combine as above (SPLIT=True). With C = 1 (contract v3's column-parallel layers) a
#   tile is one chain over K, which is what lets it reach cuBLAS speed;
# - `_gemm_tiles_kernel` (M > 64 elsewhere: fp32, a chunk not a whole number of K steps, C = 8, no TMA):
#   the same with pointer loads, in registers (SPLIT=False) or split over C programs (SPLIT=True).
# Where the chunk sums meet (registers, a slot or an fp32 workspace) and the tile shape never change a value: an
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


@jit
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
def _tma_fold_one_loop(x_desc, w_desc, off_m, off_n, KC, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr):
    """The C chunk sums of one tile added in chunk order (contract gemm.chunk_merge = "sequential") by one
    pipelined loop over all of K: the loads of the next chunk are in flight while a chunk ends (the
    accumulator is reset before the chunk's first step and added to the running sum after its last), at
    the price of waiting for each step's MMA (the chunk end reads the accumulator in the loop)."""
    steps = KC // BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    tot = tl.zeros((BM, BN), dtype=tl.float32)
    for it in range(0, C * steps):
        step = it % steps
        a = x_desc.load([off_m, it * BK])
        b = w_desc.load([off_n, it * BK])
        acc = tl.where(step == 0, 0.0, acc)
        acc = tl.dot(a, b.T, acc)
        if step == steps - 1:
            if it < steps:
                tot = acc
            else:
                tot = tot + acc
    return tot


@jit
def _tma_tree(x_desc, w_desc, off_m, off_n, KC, s0, s1, loc, C: tl.constexpr, STASH: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr,
              ONE_LOOP: tl.constexpr):
    """The C chunk sums of one tile (C in 1, 2, 4) added in the pairwise tree ((c0 + c1) + (c2 + c3)).
    Where the tree's pending operands wait (the order of additions is the same in every form):
    STASH = 0: in registers (C = 4: three accumulators live while c3 is summed); STASH = 1: (c0 + c1) in
    this program's fp32 slot s0 (two live); STASH = 2: every pending operand in slots s0/s1 (one
    accumulator live while a chunk is summed). FOLD (contract gemm.chunk_merge = "sequential"): the chunk
    sums are added in chunk order, (((c0 + c1) + c2) + c3), so two accumulators are live at most and
    nothing waits in a slot (STASH is not read); ONE_LOOP: by `_tma_fold_one_loop`, else one pipelined
    loop a chunk (the MMAs overlap, the pipeline drains at each chunk's end)."""
    if FOLD and ONE_LOOP and C > 1:
        tot = _tma_fold_one_loop(x_desc, w_desc, off_m, off_n, KC, C, BM, BN, BK)
    elif FOLD:
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
                     BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, FOLD: tl.constexpr,
                     ONE_LOOP: tl.constexpr):
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
            tot = _tma_tree(x_desc, w_desc, off_m, off_n, KC, s0, s1, loc, C, STASH, BM, BN, BK, FOLD, ONE_LOOP)
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


# -- launch plans: which kernel and tile for a shape. None of these choices changes a bit (see above).
SMALL_M = 64
"""M <= SMALL_M runs the swapped (decode) kernel."""

TMA_CHUNKS = (1, 2, 4)
"""Chunk counts the TMA kernel adds in registers (C = 8 goes to the pointer-load split kernel)."""

TMA_TILES = (  # (BM, BN, num_warps, num_stages, relative speed of one tile's work when every SM is busy)
    (128, 256, 8, 3, 1.0),
    (128, 128, 8, 4, 0.93),
    (64, 128, 4, 4, 0.65),
    (64, 64, 4, 5, 0.45),
)
"""One-chain tile shapes of the TMA kernel (all give the same bits: one chain per output element,
tests/gpu/test_kernels_gpu.py). The last number weighs a tile shape's own efficiency (measured on the
H200, lab/KERNELS_NOTES.md) against its wave quantization (`_wave_efficiency`)."""

ROW_PARALLEL_TILES = {  # merge -> ((config, when: the number of its tiles >= this many SMs' worth), ...)
    "pairwise_tree": (
        (dict(BM=128, BN=128, stash=1, num_warps=8, num_stages=4), 0.9),
        (dict(BM=128, BN=64, stash=0, num_warps=4, num_stages=5), 0.9),
    ),
    "sequential": (
        (dict(BM=128, BN=128, num_warps=8, num_stages=4, min_k_chunk=1024), 0.9),
        (dict(BM=64, BN=128, num_warps=4, num_stages=4, programs_per_sm=2), 0.45),
    ),
}
"""The 4-chunk merge in one program. Pairwise tree, measured on the H200 (lab/KERNELS_NOTES.md): 128 x 128
with (c0 + c1) waiting in an fp32 slot (two accumulators live; three in registers measured 0.1-0.2x
cuBLAS), or, with fewer tiles, 128 x 64 with all three in registers (32 a thread each). Sequential merge
(contract v5): two accumulators in registers, no slot (sm_90: 191 registers, no spills at 128 x 128 /
8 warps; 191 at 64 x 128 / 4 warps, two programs an SM). Measured on the H200 (lab/LOG.md, 2026-12-01
session 5): 128 x 128 is the faster where a chunk is at least 1024 long (8b o/down, 1.7b down:
0.72-0.90 of cuBLAS at M >= 1024); with shorter chunks the pipeline drains at every chunk end weigh
more and 64 x 128 tiles two an SM, one draining while the other computes, win (0.6b o/down 0.69-0.83
against 0.61-0.84). `min_k_chunk`: the entry needs chunks at least this long. With fewer tiles still,
the chunks go to their own programs (SPLIT)."""


def _wave_efficiency(tiles: int, sms: int) -> float:
    """Busy fraction of the SMs over ceil(tiles / sms) waves of equal tiles."""
    return tiles / (_tr.cdiv(tiles, sms) * sms)


def tma_capable(device: torch.device) -> bool:
    """An NVIDIA GPU of compute capability 9 or later (TMA descriptors; not ROCm, whose gfx942 torch also
    reports as major 9), or the interpreter (which emulates them)."""
    traits = _tr.gpu_traits(device)
    if traits is None:
        return _tr.interpreting()
    return traits.backend == "cuda" and int(traits.arch.removeprefix("sm_")[:-1] or 0) >= 9


def plan(m: int, n: int, device: torch.device, override: dict | None = None, chunks: int = 4,
         k_chunk: int = 0, bk: int = 64, dtype: torch.dtype = torch.bfloat16, merge: str = "sequential") -> dict:
    """Launch configuration for an [m, K] x [n, K]^T product over `chunks` K chunks of `k_chunk`
    elements, fixed per shape (measured on the H200, lab/KERNELS_NOTES.md; none of these choices changes
    a bit, tests/gpu prove it):
    - M <= 4: swapped, 128 weight rows a program (two wgmma M=64 halves, 4 warps), 16 token columns (the
      smallest wgmma N Triton emits), 4 stages of 64-wide K steps;
    - 4 < M <= 16: swapped, 64 weight rows, 16 tokens, 5 stages;
    - 16 < M <= 64: swapped, 64 weight rows x 64 tokens (one token tile, so the weights stream once);
    - M > 64 on Hopper (bf16/fp16, chunks in TMA_CHUNKS, a chunk a whole number of K steps): the TMA
      kernel, persistent. One chain (C = 1): the TMA_TILES shape with the best tile efficiency x wave
      efficiency. The 4-chunk merge: the first ROW_PARALLEL_TILES[merge] entry with enough tiles, else each chunk
      in its own program (SPLIT) on the largest TMA_TILES shape giving about two waves of programs;
    - otherwise: 128 x 256 pointer-load tiles, each K chunk in its own program (SPLIT)."""
    if override:
        return dict(override)
    if m <= 4:
        return dict(kind="swapped", BN=128, BT=16, num_warps=4, num_stages=4)
    if m <= 16:
        return dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=5)
    if m <= SMALL_M:
        return dict(kind="swapped", BN=64, BT=64, num_warps=4, num_stages=4)
    traits = _tr.gpu_traits(device)
    if traits is not None and traits.backend == "hip":
        # MI300X (gfx942) has 64 KB of LDS a workgroup and the 128 x 256 x 3-stage tile asks 96 KB there
        # (Triton would refuse to load it): 128 x 128 tiles, 8 warps, 2 stages (32 KB, 126 VGPRs, no
        # spills; rlkit/bench/compile_targets.py checks it). Compiled in CI, never run: not tuned.
        return dict(kind="tiles", BM=128, BN=128, GROUP_M=8, split=True, num_warps=8, num_stages=2)
    if (tma_capable(device) and dtype in (torch.bfloat16, torch.float16) and chunks in TMA_CHUNKS
            and k_chunk > 0 and k_chunk % bk == 0):
        sms = _tr.sm_count(device)
        if chunks == 1:
            bm, bn, warps, stages, _ = max(
                TMA_TILES, key=lambda t: t[4] * _wave_efficiency(_tr.cdiv(m, t[0]) * _tr.cdiv(n, t[1]), sms))
            return dict(kind="tma", BM=bm, BN=bn, GROUP_M=8, split=False, num_warps=warps, num_stages=stages)
        for cfg, fill in ROW_PARALLEL_TILES[merge]:
            cfg = dict(cfg)
            if (_tr.cdiv(m, cfg["BM"]) * _tr.cdiv(n, cfg["BN"]) >= fill * sms
                    and k_chunk >= cfg.pop("min_k_chunk", 0)):
                return dict(kind="tma", GROUP_M=8, split=False, **cfg)
        for bm, bn, warps, stages, _ in TMA_TILES[1:]:  # split: the largest tile giving ~2 waves of programs
            if _tr.cdiv(m, bm) * _tr.cdiv(n, bn) * chunks >= 1.9 * sms:
                break
        return dict(kind="tma", BM=bm, BN=bn, GROUP_M=8, split=True, num_warps=warps, num_stages=stages)
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


_SLOTS: dict[str, list[torch.Tensor]] = {}
"""str(device) -> fp32 stash-slot buffers of the TMA kernel, the newest (largest) last; like the counters,
an outgrown buffer is kept (a captured CUDA graph may point at it). Slots hold no state between launches."""


def _stash_slots(device: torch.device, n: int) -> torch.Tensor:
    bufs = _SLOTS.setdefault(str(device), [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.empty(max(n, 1 << 16), dtype=torch.float32, device=device))
    return bufs[-1]


def supported(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
              row_parallel: bool = False) -> bool:
    total = chunk_count(contract, row_parallel)
    shards = max(shards, 1)
    c = total // shards
    return (_tr.HAVE_TRITON and c in TREE_CHUNKS and total % shards == 0 and (row_parallel or shards == 1)
            and w.shape[1] % c == 0 and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and x.dtype == w.dtype)


def triton_partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
                   out_dtype: torch.dtype = torch.float32, config: dict | None = None,
                   row_parallel: bool = False) -> torch.Tensor:
    """The Triton strict GEMM: tree over this shard's chunks/shards chunks, rounded once to out_dtype
    (fp32: no rounding, the `partial` semantics). x [..., K], w [N, K] (K contiguous)."""
    return triton_launch(x, w, contract, shards, out_dtype, config, row_parallel)[0]


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


def _tma_ok(t: torch.Tensor) -> bool:
    """TMA needs a 16-byte aligned base and row stride."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def triton_launch(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
                  out_dtype: torch.dtype = torch.float32, config: dict | None = None,
                  row_parallel: bool = False) -> tuple[torch.Tensor, list[_tr.Launch]]:
    """`triton_partial` and what it launched: one `Launch` (kernel, plan, compiled stats) a kernel call."""
    check_inputs(x, w)
    c = _check_shards(contract, shards, row_parallel) // shards
    if w.shape[1] % c:
        _chunk_bounds(w.shape[1], c, contract, row_parallel)  # raises the reference's error
    return _launch(x, w, c, contract, out_dtype, config)


def _launch(x: torch.Tensor, w: torch.Tensor, c: int, contract: NumericsContract, out_dtype: torch.dtype,
            config: dict | None) -> tuple[torch.Tensor, list[_tr.Launch]]:
    """x @ w.T over `c` K chunks (K divisible by c), merged as the contract says, rounded to out_dtype."""
    launches: list[_tr.Launch] = []
    k = w.shape[1]
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
    merge_rule = contract.gemm.chunk_merge
    cfg = plan(m, n, x.device, config, chunks=c, k_chunk=kc, bk=bk, dtype=x.dtype, merge=merge_rule)
    ieee = x.dtype == torch.float32
    fold = contract.gemm.chunk_merge == "sequential"
    even_k = kc % bk == 0
    opts = _tr.launch_options(contract)
    if cfg["kind"] == "tma" and not (_tma_ok(x2) and _tma_ok(w)):
        cfg = plan(m, n, x.device, None, chunks=c, k_chunk=0, bk=bk, dtype=x.dtype, merge=merge_rule)  # pointer loads
    if cfg["kind"] == "swapped":
        grid = (_tr.cdiv(n, cfg["BN"]), c, _tr.cdiv(m, cfg["BT"]))
        ws = torch.empty(c * m * n if c > 1 else 1, dtype=torch.float32, device=x.device)
        cnt = _counters(x.device, grid[0] * grid[2])
        compiled = _gemm_swapped_kernel[grid](x2, w, y, ws, cnt, m, n, kc, x2.stride(0), w.stride(0), y.stride(0),
                                              C=c, BN=cfg["BN"], BT=cfg["BT"], BK=bk, EVEN_K=even_k, IEEE=ieee, FOLD=fold,
                                              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
        launches.append(_tr.Launch("swapped", dict(cfg, grid=grid, C=c, BK=bk), compiled))
    elif cfg["kind"] == "tma":
        bm, bn = cfg["BM"], cfg["BN"]
        split = bool(cfg["split"]) and c > 1
        if c not in TMA_CHUNKS or kc % bk or ieee:
            raise OpInputError(OP, f"the TMA kernel runs bf16/fp16 with {TMA_CHUNKS} chunks of whole "
                                   f"{bk}-wide K steps; got {x.dtype}, {c} chunks of {kc}")
        slab = m
        if split and c * m * n * 4 > WORKSPACE_BYTES:
            slab = max(bm, WORKSPACE_BYTES // (c * n * 4) // bm * bm)
        w_desc = _descriptor(w, [bn, bk])
        for lo in range(0, m, slab):
            xs, ys = x2[lo : lo + slab], y[lo : lo + slab]
            ms = xs.shape[0]
            if ms < bm:  # a TMA box never exceeds the tensor: pad to one tile (zero rows are never stored)
                xs = torch.cat([xs, xs.new_zeros(bm - ms, k)])
            x_desc = _descriptor(xs, [bm, bk])
            tiles = _tr.cdiv(ms, bm) * _tr.cdiv(n, bn)
            if split:
                grid = (tiles, c)
                ws = torch.empty(c * ms * n, dtype=torch.float32, device=x.device)
                cnt = _counters(x.device, tiles)
            else:
                grid = (min(tiles, cfg.get("programs_per_sm", 1) * _tr.sm_count(x.device)),)
                stash = cfg.get("stash", 0) if c > 1 else 0
                ws = _stash_slots(x.device, grid[0] * 2 * bm * bn if stash else 1)
                cnt = ws  # no counters without SPLIT
            if cfg.get("flat") and not split and _tma_ok(ys):  # else the nested form: the same bits
                compiled = _gemm_tma_flat_kernel[grid](
                    x_desc, w_desc, _descriptor(ys, [bm, bn]), ws, ms, n, kc, grid[0], C=c, STASH=stash, BM=bm, BN=bn,
                    BK=bk, GROUP_M=cfg["GROUP_M"], WARP_SPECIALIZE=bool(cfg.get("warp_specialize")), FOLD=fold,
                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
                launches.append(_tr.Launch("tma_flat", dict(cfg, grid=grid, C=c, BK=bk, split=False), compiled))
                continue
            compiled = _gemm_tma_kernel[grid](
                x_desc, w_desc, ys, ws, cnt, ms, n, kc, ys.stride(0), grid[0], C=c, SPLIT=split,
                STASH=0 if split else stash, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"], FOLD=fold,
                ONE_LOOP=bool(cfg.get("one_loop")) and fold,
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
            launches.append(_tr.Launch("tma", dict(cfg, grid=grid, C=c, BK=bk, split=split), compiled))
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
                BM=cfg["BM"], BN=cfg["BN"], BK=bk, GROUP_M=cfg["GROUP_M"], EVEN_K=even_k, IEEE=ieee, FOLD=fold,
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
            launches.append(_tr.Launch("tiles", dict(cfg, grid=grid, C=c, BK=bk, split=split), compiled))
    return y.reshape(*lead, n), launches


# -- the strict entry points rlkit.ops calls ------------------------------------------------------------
class _StrictLinear(torch.autograd.Function):
    """Forward: the strict GEMM (Triton on CUDA, the reference elsewhere). Backward: native products in
    the model dtype (gradients need not be bitwise; only the forward's logprobs are compared)."""

    @staticmethod
    def forward(ctx, x, w, contract, out_dtype, row_parallel):
        ctx.save_for_backward(x, w)
        return _forward(x, w, contract, out_dtype, row_parallel)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        g = grad.to(x.dtype)
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = (g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        return gx, gw, None, None, None


def _forward(x, w, contract, out_dtype, row_parallel):
    if _tr.on_gpu(x, w) and supported(x, w, contract, 1, row_parallel):
        return triton_partial(x, w, contract, 1, out_dtype or x.dtype, row_parallel=row_parallel)
    return reference(x, w, contract, out_dtype, row_parallel)


def strict(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
           out_dtype: torch.dtype | None = None, row_parallel: bool = False) -> torch.Tensor:
    """Strict y = x @ w.T: the Triton kernel for CUDA tensors, the reference otherwise; under autograd
    the same forward with a native backward. `row_parallel`: the layer is row-parallel (its K chunk
    count is gemm.k_chunks, else gemm.column_k_chunks), whether or not it is split over ranks now."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return _StrictLinear.apply(x, w, contract, out_dtype, row_parallel)
    return _forward(x, w, contract, out_dtype, row_parallel)


def triton_shard_partials(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
                          shards: int = 1) -> torch.Tensor:
    """`shard_partials` of a row-parallel shard on the GPU: its subtree in one launch (pairwise tree, or
    shards = 1), or under the sequential merge each of its chunks as one chain (a launch a chunk over
    that K slice: the same chain the merged kernel runs for it)."""
    pieces = pieces_per_shard(contract, shards)
    if pieces == 1:
        return triton_partial(x, w, contract, shards, torch.float32, row_parallel=True).unsqueeze(0)
    check_inputs(x, w)
    bounds = _chunk_bounds(w.shape[1], pieces, contract, True)
    return torch.stack([_launch(x[..., lo:hi], w[:, lo:hi], 1, contract, torch.float32, None)[0]
                        for lo, hi in bounds])


def strict_shard_partials(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
                          shards: int = 1) -> torch.Tensor:
    """[pieces, ..., N] fp32: what a row-parallel shard contributes to the merge (`shard_partials`;
    forward only on the GPU path)."""
    if _tr.on_gpu(x, w) and supported(x, w, contract, shards, True) and not (
            torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        return triton_shard_partials(x, w, contract, shards)
    return shard_partials(x, w, contract, shards, row_parallel=True)
