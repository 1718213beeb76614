"""Strict GEMM: y = x @ w.T with the contract's canonical K reduction.

Contract (GemmSpec): K is cut into `k_chunks` equal contiguous chunks; each chunk's partial sum is fp32;
the partials merge in the canonical pairwise tree (kernels/tree.py) in fp32; the result is rounded once.

CPU reference: each chunk partial comes from the backend's fp32 GEMM, but every call has exactly
`row_tile` rows (padded with zero rows), so the backend's blocking, and therefore each row's order of
additions inside a chunk, is the same whether the row is alone or in a batch of 8192. Measured on this
machine's MKL: a plain `x @ w.T` gives different bits for a row alone and the same row in any batch of 2
or more; the fixed-tile calls give identical bits (tests/kernels/test_gemm.py).

Row-parallel tensor parallelism: a rank holding K/tp of the columns computes the subtree of its
k_chunks/tp chunks with `partial(...)`; `rlkit.kernels.collectives.all_reduce` gathers the per-rank fp32
partials and combines the top levels of the same tree, so TP 1, 2 and 4 give the same bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    wf = w.float()
    tile = contract.gemm.row_tile
    padded, m = _tile_rows(x2d, tile)
    # Every operand is made contiguous in one canonical layout ([rows, kc] and [N, kc]), so a TP shard
    # (whose row stride is K/tp) hands the backend exactly what the unsharded layer does.
    w_chunks = [wf[:, lo:hi].contiguous() for lo, hi in bounds]
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
