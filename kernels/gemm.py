"""Strict GEMM: y = x @ w.T with the contract's canonical K reduction.

Contract (GemmSpec): K is cut into `chunk_count(contract, row_parallel)` equal contiguous chunks (`k_chunks` for
the row-parallel layers, whose K tensor parallelism splits; `column_k_chunks` for every other GEMM); each
chunk's partial sum is fp32; the partials merge in fp32 by `gemm.chunk_merge` (in chunk order from version
5, ((c0 + c1) + c2) + c3; the canonical pairwise tree of kernels/tree.py before); the result is rounded once.
With one chunk the sum is one fp32 chain over K in K order. Under the chained merge (contract v6, the
row-parallel layers) no chunk but the first starts from zero: chunk c accumulates onto the fp32 sum of
chunks 0..c-1 (`chain_partial`), which on the GPU is one chain over K, the column layers' arithmetic.

CPU reference: each chunk partial comes from the backend's fp32 GEMM, but every call has exactly
`row_tile` rows (padded with zero rows), so the backend's blocking, and therefore each row's order of
additions inside a chunk, is the same whether the row is alone or in a batch of 8192. Measured on this
machine's MKL: a plain `x @ w.T` gives different bits for a row alone and the same row in any batch of 2
or more; the fixed-tile calls give identical bits (tests/kernels/test_gemm.py).

Row-parallel tensor parallelism: a rank holding K/tp of the columns computes `shard_partials(...)`: the
fp32 pieces of the merge it can finish alone (the subtree of its k_chunks/tp chunks under the pairwise
tree; each of its chunk partials under the sequential merge, whose running sum crosses the ranks); the
ranks gather them in rank order (`rlkit.kernels.collectives.gather`) and `merge` finishes the same
merge, so TP 1, 2 and 4 give the same bits. Under the chained merge a rank instead continues the running
sum of the ranks before it (`chain_partial(..., start=)`; `rlkit.kernels.collectives.chain` passes it on).

GPU: the Triton kernels of kernels/gemm_kernels.py run the same contract on tensor cores for CUDA tensors
(`strict(...)` picks them; `rlkit.ops.linear` calls `strict`). They read `gemm.k_chunks`, `gemm.k_tile`,
`gemm.chunk_merge` and `gpu.fp_fusion`, and cover k_chunks / shards in TREE_CHUNKS (1, 2, 4, 8; unrolled); other
chunk counts run the reference, which defines the contract. `triton_launch` returns what it launched
(plan and compiled kernel) to the caller that asks, the benchmarks. A one-chain product (chunk count 1:
the column layers from v3) runs on cuBLAS instead where kernels/gemm_cublas.py admits it: cuBLAS without
split-K gives the Triton kernel's bits there, checked per shape at first use (a launch choice, like the
plan). Where the GPU model's table (kernels/gemm_tuned.py) measured another Triton launch faster for a
product of few rows, that launch runs first, its bits likewise compared with the plan's at first use.
"""

from __future__ import annotations

import functools
import warnings

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


def chained(contract: NumericsContract, row_parallel: bool) -> bool:
    """Whether this GEMM's chunks chain (each starts from the running sum of those before it): the
    row-parallel layers under gemm.chunk_merge = "chained" (contract v6). On the GPU such a product is
    one chain over K, computed by the one-chain kernels (and the cuBLAS route) of the column layers."""
    return row_parallel and contract.gemm.chunk_merge == "chained"


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
    if contract.gemm.chunk_merge == "chained":
        if len(items) != 1:
            raise OpInputError(OP, f"{len(items)} fp32 pieces to merge: under the chained merge a product has "
                                   f"one running sum (pass it on with chain_partial(..., start=))")
        return items[0]
    if contract.gemm.chunk_merge == "sequential":
        return sequential_sum(items)
    return pairwise_sum(items)


def pieces_per_shard(contract: NumericsContract, shards: int, row_parallel: bool = True) -> int:
    """How many fp32 pieces a TP shard contributes to the merge: its subtree (1) under the pairwise tree,
    each of its chunks under the sequential merge (whose running sum crosses the shards)."""
    chunks = _check_shards(contract, shards, row_parallel) // shards
    return chunks if contract.gemm.chunk_merge == "sequential" and shards > 1 else 1


def _operand_chunks(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int,
                    row_parallel: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], int, int]:
    """The CPU reference's operands for one shard: x's rows in fp32, padded to whole `row_tile` tiles, and
    w, each cut into the shard's K chunks; returns (x chunks, w chunks (cached), padded rows, real rows).
    Every operand is made contiguous in one canonical layout ([rows, kc] and [N, kc]), so a TP shard
    (whose row stride is K/tp) hands the backend exactly what the unsharded layer does."""
    chunks_total = _check_shards(contract, shards, row_parallel)
    bounds = _chunk_bounds(w.shape[1], chunks_total // shards, contract, row_parallel)
    padded, m = _tile_rows(x.reshape(-1, x.shape[-1]).float(), contract.gemm.row_tile)
    return [padded[:, lo:hi].contiguous() for lo, hi in bounds], _weight_chunks(w, bounds), padded.shape[0], m


def chain_partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, start: torch.Tensor | None = None,
                  shards: int = 1) -> torch.Tensor:
    """fp32 [..., N]: a row-parallel shard's product under the chained merge, unrounded. `start` is the
    running fp32 sum of the K before this shard (the ranks before it; None: this shard's K comes first, the
    chain starts from zero). The CPU reference: each of the shard's gemm.k_chunks / shards chunks is one
    backend fp32 GEMM of `row_tile` rows onto the running sum (torch.addmm, beta = 1), so TP t issues,
    rank after rank, exactly the calls TP 1 issues."""
    check_inputs(x, w)
    if not chained(contract, True):
        raise OpInputError(OP, f"chain_partial needs gemm.chunk_merge = 'chained' (contract v6); this contract's "
                               f"is {contract.gemm.chunk_merge!r} (use shard_partials)")
    x_chunks, w_chunks, rows, m = _operand_chunks(x, w, contract, shards, True)
    _check_start(start, m, w.shape[0], x.device)
    tile = contract.gemm.row_tile
    acc_in = None if start is None else _tile_rows(start.reshape(m, -1).float(), tile)[0]
    out = torch.empty(rows, w.shape[0], dtype=torch.float32, device=x.device)
    for r in range(0, rows, tile):
        acc = None if acc_in is None else acc_in[r : r + tile]
        for xc, wc in zip(x_chunks, w_chunks):
            acc = xc[r : r + tile] @ wc.t() if acc is None else torch.addmm(acc, xc[r : r + tile], wc.t())
        out[r : r + tile] = acc
    return out[:m].reshape(*x.shape[:-1], w.shape[0])


def _check_start(start: torch.Tensor | None, m: int, n: int, device: torch.device) -> None:
    if start is None:
        return
    if start.dtype != torch.float32 or start.device != device or start.numel() != m * n:
        raise OpInputError(OP, f"the running sum to continue must be fp32 [{m}, {n}] on {device}; got "
                               f"{start.dtype} {tuple(start.shape)} on {start.device}")


def shard_partials(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract, shards: int = 1,
                   row_parallel: bool = False) -> torch.Tensor:
    """[pieces, ..., N] fp32: what this shard's K range contributes to the merge, unrounded
    (`pieces_per_shard`; `row_parallel`: the layer's chunk count is gemm.k_chunks, else
    gemm.column_k_chunks). `merge` over every shard's pieces in rank order gives `partial(x, w)` of the
    whole K; with shards=1 the one piece is that full fp32 result before its single rounding."""
    check_inputs(x, w)
    if chained(contract, row_parallel):
        if shards > 1:
            raise OpInputError(OP, f"{shards} shards under the chained merge: a shard continues the running sum "
                                   f"of the shards before it (chain_partial(..., start=)), it has no pieces of its own")
        return chain_partial(x, w, contract).unsqueeze(0)
    x_chunks, w_chunks, rows, m = _operand_chunks(x, w, contract, shards, row_parallel)
    pieces = pieces_per_shard(contract, shards, row_parallel)
    tile = contract.gemm.row_tile
    out = torch.empty(pieces, rows, w.shape[0], dtype=torch.float32, device=x.device)
    for r in range(0, rows, tile):
        parts = [xc[r : r + tile] @ wc.t() for xc, wc in zip(x_chunks, w_chunks)]
        if pieces == 1:
            out[0, r : r + tile] = merge(parts, contract)
        else:
            out[:, r : r + tile] = torch.stack(parts)
    return out[:, :m].reshape(pieces, *x.shape[:-1], w.shape[0])


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


# The Triton kernels (kernels/gemm_kernels.py) run this contract on tensor cores for CUDA tensors; what
# follows chooses their launches (none of these choices changes a bit) and calls them.
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels import gemm_cublas as _cublas  # noqa: E402
from rlkit.kernels import gemm_gluon as _gluon  # noqa: E402
from rlkit.kernels import gemm_tuned as _tuned  # noqa: E402
from rlkit.kernels.gemm_kernels import (TREE_CHUNKS, _gemm_continue_kernel, _gemm_swapped_kernel,  # noqa: E402
                                        _gemm_tiles_kernel, _gemm_tma_flat_kernel, _gemm_tma_kernel)

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


GLUON_ROW_PARALLEL = dict(BM=64, BN=128, GROUP_M=8, num_warps=4, num_stages=4, programs_per_sm=2)
"""The ordered 4-chunk merge as kernels/gemm_gluon.py's kernel: 64 x 128 tiles of one warpgroup, two
programs an SM, the loads running ahead across chunk ends. Taken on sm_90 where there are at least
GLUON_FILL tiles an SM (one wave of two programs each) and a chunk is at most GLUON_MAX_K_CHUNK long. Measured
on the H200 in two runs (lab/gluon_gemm_h200.py, lab/LOG.md 2026-12-03 session 17), cuBLAS / strict at
M >= 1000: Gluon 0.68-0.92 against the Triton kernel's 0.65-0.96 in the same runs; it gains where chunks
are short and there are many tiles (1.7b o M = 4096: 0.65 -> 0.76, 0.6b o M = 4096: 0.71 -> 0.82, 8b o
M = 1024: 0.74 -> 0.82) and loses to the Triton kernel's 128 x 128 tiles where a chunk is 3072 long
(8b down M = 8192: 0.89 against 0.78) or tiles are few (M = 256)."""
GLUON_FILL = 1.9
GLUON_MAX_K_CHUNK = 1536

GLUON_FEW_TILES = dict(BM=64, BN=64, GROUP_M=8, num_warps=4, num_stages=6, programs_per_sm=2)
"""The ordered merge where GLUON_ROW_PARALLEL's tiles are too few for two an SM but 64 x 64 tiles give at
least GLUON_FEW_TILES_FILL of an SM each (M = 256 on the 8b and 1.7b o/down, M = 1024 on 0.6b): the same
kernel at half the tile width, two an SM, a 6-slot ring, any chunk length. Measured on the H200 (lab/LOG.md
2026-12-04 session 21, cuBLAS without a workspace / strict): 8b o 0.84 -> 0.89, 8b down 0.60 -> 0.70,
1.7b o 0.59 -> 0.71, 1.7b down 0.57 -> 0.64 at M = 256; 0.6b o 0.70 -> 0.75, 0.6b down 0.74 -> 0.75 at
M = 1024 (the plan's Triton kernel before)."""
GLUON_FEW_TILES_FILL = 0.9

SWAPPED_NARROW_FILL = 0.6
"""17 <= M <= 64 with chunks: the swapped kernel takes 32-token tiles (two token tiles at M = 64) where its
64-token tiles would give fewer programs than this many SMs' worth (0.6b o/down: 16 weight tiles x 4
chunks). H200, session 21: 0.6b o 0.86 -> 0.96, down 0.95 -> 1.08 of cuBLAS at M = 64; where 64-token tiles
already give an SM a program or more (8b, 1.7b) 32-token tiles were slower (0.60-0.96 against 0.79-1.24)."""


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
         k_chunk: int = 0, bk: int = 64, dtype: torch.dtype = torch.bfloat16, merge: str = "sequential",
         gluon: bool = True) -> dict:
    """Launch configuration for an [m, K] x [n, K]^T product over `chunks` K chunks of `k_chunk`
    elements, fixed per shape (measured on the H200, lab/KERNELS_NOTES.md; none of these choices changes
    a bit, tests/gpu prove it):
    - M <= 4: swapped, 128 weight rows a program (two wgmma M=64 halves, 4 warps), 16 token columns (the
      smallest wgmma N Triton emits), 4 stages of 64-wide K steps;
    - 4 < M <= 16: swapped, 64 weight rows, 16 tokens, 5 stages;
    - 16 < M <= 64: swapped, 64 weight rows x 64 tokens (one token tile, so the weights stream once), or
      x 32 tokens where chunked programs would be too few for the SMs (SWAPPED_NARROW_FILL);
    - M > 64 on Hopper (bf16/fp16, chunks in TMA_CHUNKS, a chunk a whole number of K steps): the TMA
      kernel, persistent. One chain (C = 1): the TMA_TILES shape with the best tile efficiency x wave
      efficiency. The 4-chunk ordered merge on sm_90 with many tiles and chunks of at most
      GLUON_MAX_K_CHUNK: the Gluon kernel (GLUON_ROW_PARALLEL; `gluon=False` leaves it out); with too few
      of its tiles for that but enough 64 x 64 ones, the same kernel on those (GLUON_FEW_TILES). Otherwise the
      first ROW_PARALLEL_TILES[merge] entry with enough tiles, else each chunk
      in its own program (SPLIT) on the largest TMA_TILES shape giving about two waves of programs;
    - otherwise: 128 x 256 pointer-load tiles, each K chunk in its own program (SPLIT)."""
    if override:
        return dict(override)
    if m <= 4:
        return dict(kind="swapped", BN=128, BT=16, num_warps=4, num_stages=4)
    if m <= 16:
        return dict(kind="swapped", BN=64, BT=16, num_warps=4, num_stages=5)
    if m <= SMALL_M:
        narrow = chunks > 1 and _tr.cdiv(n, 64) * chunks * _tr.cdiv(m, 64) < SWAPPED_NARROW_FILL * _tr.sm_count(device)
        return dict(kind="swapped", BN=64, BT=32 if narrow else 64, num_warps=4, num_stages=4)
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
        if gluon and merge == "sequential" and _gluon.AVAILABLE and traits is not None and traits.arch == "sm_90":
            tiles = _tr.cdiv(m, GLUON_ROW_PARALLEL["BM"]) * _tr.cdiv(n, GLUON_ROW_PARALLEL["BN"])
            if tiles >= GLUON_FILL * sms and k_chunk <= GLUON_MAX_K_CHUNK:
                return dict(kind="gluon", **GLUON_ROW_PARALLEL)
            if (tiles < GLUON_FILL * sms and _tr.cdiv(m, GLUON_FEW_TILES["BM"]) * _tr.cdiv(n, GLUON_FEW_TILES["BN"])
                    >= GLUON_FEW_TILES_FILL * sms):
                return dict(kind="gluon", **GLUON_FEW_TILES)
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


def _shard_chunks(w: torch.Tensor, contract: NumericsContract, shards: int, row_parallel: bool) -> int:
    """The shard's share of the contract's K chunks, after the reference's checks (the same shapes are
    refused on the GPU as on the CPU, with the same errors; a chained product too, though its GPU kernel
    runs one chain)."""
    c = _check_shards(contract, shards, row_parallel) // shards
    if w.shape[1] % c:
        _chunk_bounds(w.shape[1], c, contract, row_parallel)  # raises the reference's error
    return c


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
    c = _shard_chunks(w, contract, shards, row_parallel)
    return _launch(x, w, 1 if chained(contract, row_parallel) else c, contract, out_dtype, config)


def _k_step(cfg: dict, k_tile: int) -> int:
    """A kernel's load step: the contract's K step, or (cfg "BK") a divisor or a multiple of it that is a whole
    number of k16 MMAs. Any of them issues the same k16 tensor-core MMAs in the same K order on one
    accumulator, so the chain is the same (the contract's K step is where the Triton kernels' `tl.dot`
    calls meet, not a rounding); a smaller step lets more of them sit in the shared-memory ring, a larger
    one keeps more bytes in flight a program and loads half as often. Taken by the Gluon kernel (a chunk
    must be a whole number of load steps: `supported`), the swapped and the tiles kernels (where the chunk is
    not a whole number of them, the contract's step)."""
    step = cfg.get("BK", k_tile)
    if step % 16 or (k_tile % step and step % k_tile):
        raise ValueError(f"gemm plan BK={step}: a kernel's K step must be a multiple of 16 dividing or "
                         f"divided by the contract's K step ({k_tile})")
    return step


def _chunk_step(cfg: dict, k_tile: int, k_chunk: int) -> int:
    """The K step of a swapped or tiles launch: the launch's (`_k_step`) where the chunk is a whole number
    of them, else the contract's (a short last step is masked)."""
    step = _k_step(cfg, k_tile)
    return step if k_chunk % step == 0 else k_tile


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
    opts = _tr.launch_options(contract)
    gluon_bk = _k_step(cfg, bk) if cfg["kind"] == "gluon" else bk
    if cfg["kind"] == "gluon" and not (fold and c > 1 and _gluon.supported(x2, w, y, c, kc, gluon_bk, cfg["BM"])):
        cfg = plan(m, n, x.device, None, chunks=c, k_chunk=kc, bk=bk, dtype=x.dtype, merge=merge_rule, gluon=False)
    if cfg["kind"] == "tma" and not (_tma_ok(x2) and _tma_ok(w)):
        cfg = plan(m, n, x.device, None, chunks=c, k_chunk=0, bk=bk, dtype=x.dtype, merge=merge_rule)  # pointer loads
    if cfg["kind"] == "swapped":
        grid = (_tr.cdiv(n, cfg["BN"]), c, _tr.cdiv(m, cfg["BT"]))
        ws = torch.empty(c * m * n if c > 1 else 1, dtype=torch.float32, device=x.device)
        cnt = _counters(x.device, grid[0] * grid[2])
        step = _chunk_step(cfg, bk, kc)
        compiled = _gemm_swapped_kernel[grid](x2, w, y, ws, cnt, m, n, kc, x2.stride(0), w.stride(0), y.stride(0),
                                              C=c, BN=cfg["BN"], BT=cfg["BT"], BK=step, EVEN_K=kc % step == 0,
                                              IEEE=ieee, FOLD=fold, num_warps=cfg["num_warps"],
                                              num_stages=cfg["num_stages"], **opts)
        launches.append(_tr.Launch("swapped", dict(cfg, grid=grid, C=c, BK=step), compiled))
    elif cfg["kind"] == "gluon":
        compiled, grid = _gluon.launch(x2, w, y, c, kc, gluon_bk, cfg, _tr.sm_count(x.device), opts)
        launches.append(_tr.Launch("gluon", dict(cfg, grid=grid, C=c, BK=gluon_bk), compiled))
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
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
            launches.append(_tr.Launch("tma", dict(cfg, grid=grid, C=c, BK=bk, split=split), compiled))
    else:
        split = bool(cfg["split"]) and c > 1
        slab = m
        if split and c * m * n * 4 > WORKSPACE_BYTES:
            slab = max(cfg["BM"], WORKSPACE_BYTES // (c * n * 4) // cfg["BM"] * cfg["BM"])
        step = _chunk_step(cfg, bk, kc)
        for lo in range(0, m, slab):
            xs, ys = x2[lo : lo + slab], y[lo : lo + slab]
            ms = xs.shape[0]
            tiles = _tr.cdiv(ms, cfg["BM"]) * _tr.cdiv(n, cfg["BN"])
            grid = (tiles, c if split else 1)
            ws = torch.empty(c * ms * n if split else 1, dtype=torch.float32, device=x.device)
            cnt = _counters(x.device, tiles)
            compiled = _gemm_tiles_kernel[grid](
                xs, w, ys, ws, cnt, ms, n, kc, xs.stride(0), w.stride(0), ys.stride(0), C=c, SPLIT=split,
                BM=cfg["BM"], BN=cfg["BN"], BK=step, GROUP_M=cfg["GROUP_M"], EVEN_K=kc % step == 0, IEEE=ieee,
                FOLD=fold, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **opts)
            launches.append(_tr.Launch("tiles", dict(cfg, grid=grid, C=c, BK=step, split=split), compiled))
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
        out = out_dtype or x.dtype
        if chained(contract, row_parallel) or chunk_count(contract, row_parallel) == 1:
            _shard_chunks(w, contract, 1, row_parallel)
            return _one_chain(x, w, contract, out)
        return triton_partial(x, w, contract, 1, out, row_parallel=row_parallel)
    return reference(x, w, contract, out_dtype, row_parallel)


def _one_chain(x, w, contract, out):
    """One chain over K on the GPU: the launch this GPU model's table measured fastest for the shape
    (kernels/gemm_tuned.py), else cuBLAS where its route admits the shape, else the Triton kernel's plan;
    the first two checked against the plan's bits at their first use."""
    check_inputs(x, w)
    x2 = x.reshape(-1, x.shape[-1])
    measured = measured_launch(x2, w, contract, out)
    if measured is not None:
        return _launch(x, w, 1, contract, out, measured)[0]
    if _cublas.admitted(x2, w, out, contract, lambda a, b: _launch(a, b, 1, contract, out, None)[0]):
        return _cublas.linear(x2, w, out).reshape(*x.shape[:-1], w.shape[0])
    return _launch(x, w, 1, contract, out, None)[0]


_MEASURED_CHECKED: dict[tuple, bool] = {}
"""(device, table entry, out dtype, GEMM contract) -> whether the entry's launch gave the plan's bits."""


def measured_launch(x2: torch.Tensor, w: torch.Tensor, contract: NumericsContract, out: torch.dtype) -> dict | None:
    """The launch of the table entry (kernels/gemm_tuned.py) covering this one-chain product on this GPU
    model, once its bits have been compared with the plan's launch on seeded inputs at the first and last
    row count it covers (at the first use outside CUDA graph capture; until then, and where they differ,
    None: the plan's launch or the cuBLAS route, the same bits)."""
    if x2.shape[0] > _tuned.ROW_RANGES[-1][1]:
        return None
    name = _device_name(x2.device)
    entry = _tuned.entry(name, x2.shape[0], w.shape[1], w.shape[0], x2.dtype) if name else None
    if entry is None:
        return None
    key = (str(x2.device), entry, out, contract.gemm)
    verdict = _MEASURED_CHECKED.get(key)
    if verdict is None:
        if x2.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        x = _check_input(entry.rows[1], w.shape[1], x2.dtype, x2.device)
        verdict = _MEASURED_CHECKED[key] = _measured_matches_plan(entry, name, x, w, contract, out)
    return entry.config() if verdict else None


def _check_input(rows: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The rows a measured launch is compared with the plan on (the cuBLAS route's kind of input)."""
    return _cublas.seeded(rows, k, dtype, device, seed=107)


def _measured_matches_plan(entry, device: str, x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
                           out: torch.dtype) -> bool:
    """Whether the entry's launch gives the plan's launch's bits at the first and last row count it covers
    (a launch this Triton or contract cannot make counts as differing); warns naming the entry if not."""
    rows = sorted(set(entry.rows))
    try:
        problem = _cublas.first_difference(lambda a, b: _launch(a, b, 1, contract, out, entry.config())[0],
                                           lambda a, b: _launch(a, b, 1, contract, out, None)[0], x, w, rows)
    except Exception as e:  # noqa: BLE001 - a launch this Triton or contract cannot make: refused, not fatal
        problem = f"{type(e).__name__}: {str(e)[:200]}"
    if problem is not None:
        warnings.warn(f"rlkit: the measured launch {entry.config()} for K={entry.k} N={entry.n} rows "
                      f"{entry.rows[0]}-{entry.rows[1]} on {device} is refused ({problem}); the plan runs it",
                      stacklevel=4)
    return problem is None


def measured_status() -> list[dict]:
    """Every measured launch this process compared with the plan, and whether it runs: one dict each
    (device, K, N, rows, launch, out dtype, taken)."""
    return [dict(device=dev, K=e.k, N=e.n, rows=e.rows, launch=e.config(), out=str(out).removeprefix("torch."),
                 taken=taken) for (dev, e, out, _), taken in _MEASURED_CHECKED.items()]


@functools.cache
def _device_name(device: torch.device) -> str:
    """The GPU model a table is looked up by ("" for CPU tensors: no table)."""
    if device.type != "cuda":
        return ""
    return torch.cuda.get_device_name(device.index if device.index is not None else torch.cuda.current_device())


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


def strict_chain_partial(x: torch.Tensor, w: torch.Tensor, contract: NumericsContract,
                         start: torch.Tensor | None = None, shards: int = 1) -> torch.Tensor:
    """`chain_partial` on the GPU (forward only): without `start` the shard's one chain from zero (the
    one-chain kernels, cuBLAS where admitted, fp32 out); with it `_gemm_continue_kernel`, the chain run on
    from the running sum. Elsewhere the reference."""
    if not (_tr.on_gpu(x, w) and supported(x, w, contract, shards, True) and chained(contract, True)
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
        return chain_partial(x, w, contract, start, shards)
    check_inputs(x, w)
    _shard_chunks(w, contract, shards, True)
    if start is None:
        return _one_chain(x, w, contract, torch.float32)
    return continue_launch(x, w, start, contract)[0]


def continue_plan(m: int, n: int, device: torch.device) -> dict:
    """`_gemm_continue_kernel`'s tiles: the swapped plan of the row count (M > 64: 64 tokens a tile)."""
    return plan(min(m, SMALL_M), n, device, chunks=1)


def continue_launch(x: torch.Tensor, w: torch.Tensor, start: torch.Tensor, contract: NumericsContract,
                    out_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, list[_tr.Launch]]:
    """start + x @ w.T as one tensor-core chain that starts from `start` (fp32 [..., N]), rounded once to
    out_dtype; and what it launched. The swapped tiles of `plan` for the row count (weights the MMA's
    row operand: the wgmma shapes at every M)."""
    k = w.shape[1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    m, n = x2.shape[0], w.shape[0]
    _check_start(start, m, n, x.device)
    start2 = start.reshape(m, n).contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n), []
    bk = contract.gemm.k_tile
    cfg = continue_plan(m, n, x.device)
    grid = (_tr.cdiv(n, cfg["BN"]), _tr.cdiv(m, cfg["BT"]))
    compiled = _gemm_continue_kernel[grid](x2, w, start2, y, m, n, k, x2.stride(0), w.stride(0), y.stride(0),
                                           BN=cfg["BN"], BT=cfg["BT"], BK=bk, EVEN_K=k % bk == 0,
                                           IEEE=x.dtype == torch.float32, num_warps=cfg["num_warps"],
                                           num_stages=cfg["num_stages"], **_tr.launch_options(contract))
    return y.reshape(*lead, n), [_tr.Launch("continue", dict(cfg, grid=grid, BK=bk), compiled)]
