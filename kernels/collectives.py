"""Strict all-reduce: gather every rank's fp32 partial, combine them in rank order by the canonical tree.

Contract (CollectiveSpec): the wire carries fp32 partials (a rank's GEMM subtree result, unrounded);
every rank receives all of them and computes the same pairwise tree (kernels/tree.py) in rank order, so
every rank holds the same bits, and those bits equal the single-process tree over the same partials.
Never a ring or the library's algorithm choice, whose order depends on the world size and the transport.

The chained merge (contract v6's row-parallel GEMM) moves no partials to be combined: `chain` passes
one running fp32 sum through the ranks in rank order (rank r continues the sum of ranks 0..r-1), and the
last rank's result, rounded once, is broadcast. The order is fixed by the ranks, never the transport.

Works over any torch.distributed process group (gloo on the CPU, NCCL on GPUs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from rlkit.kernels.errors import OpInputError
from rlkit.kernels.tree import pairwise_sum

OP = "all_reduce"


def canonical_sum(partials: list[torch.Tensor]) -> torch.Tensor:
    """The single-process definition: the tree over per-rank partials in rank order."""
    return pairwise_sum([p.float() for p in partials])


def reference(partial: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce (sum) of fp32 partials; returns a new fp32 tensor, identical on every rank."""
    if partial.dtype != torch.float32:
        raise OpInputError(OP, f"partials travel in fp32 (contract collectives.wire_dtype); got {partial.dtype}")
    if not dist.is_available() or not dist.is_initialized():
        return partial.clone()
    world = dist.get_world_size(group)
    if world == 1:
        return partial.clone()
    gathered = [torch.empty_like(partial) for _ in range(world)]
    dist.all_gather(gathered, partial.contiguous(), group=group)
    return canonical_sum(gathered)


def gather(pieces: torch.Tensor, group=None) -> torch.Tensor:
    """[world * P, ...]: every rank's fp32 pieces [P, ...] concatenated in rank order, on every rank (the
    row-parallel GEMM's merge then runs over them: kernels/gemm.py `merge`)."""
    if pieces.dtype != torch.float32:
        raise OpInputError(OP, f"partials travel in fp32 (contract collectives.wire_dtype); got {pieces.dtype}")
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return pieces.clone()
    gathered = [torch.empty_like(pieces) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, pieces.contiguous(), group=group)
    return torch.cat(gathered)


def native(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """torch.distributed.all_reduce in the tensor's own dtype (the backend decides the order)."""
    out = tensor.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(out, group=group)
    return out


def chain_blocks(rows: int, world: int) -> list[tuple[int, int]]:
    """The row blocks `chain` pipelines over: 2 x world of them (at most one a row), equal but the last.
    With P blocks a row-parallel layer's t ranks take (P + t - 1) / P of one rank's time instead of t times
    it. Rows are independent and the strict GEMM is batch-invariant, so the split moves no bit."""
    if rows <= 0:
        return [(0, 0)]
    count = min(rows, 2 * world)
    size = -(-rows // count)
    return [(lo, min(lo + size, rows)) for lo in range(0, rows, size)]


def chain(step: Callable[[torch.Tensor | None, int, int], torch.Tensor], rows: int, cols: int,
          device: torch.device, out_dtype: torch.dtype, group=None) -> torch.Tensor:
    """The running fp32 sum [rows, cols] passed through `group` in rank order: rank 0 computes
    `step(None, lo, hi)` (its part of rows lo:hi from zero), rank r > 0 receives rank r - 1's sum of those
    rows and computes `step(start, lo, hi)` (its part accumulated onto it) and passes it on; the last rank
    rounds it once to `out_dtype` and broadcasts the whole, so every rank returns the same bits, those of
    one process running every rank's step in turn. The rows go in `chain_blocks`, each sent on while the
    next is computed (rank r works on block b while rank r - 1 is on block b + 1)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return _checked(step(None, 0, rows), rows, cols).to(out_dtype)
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    out = torch.empty(rows, cols, dtype=out_dtype, device=device)
    sends = []
    for lo, hi in chain_blocks(rows, world):
        start = None
        if rank > 0:
            start = torch.empty(hi - lo, cols, dtype=torch.float32, device=device)
            dist.recv(start, src=ranks[rank - 1], group=group)
        total = _checked(step(start, lo, hi), hi - lo, cols).contiguous()
        if rank < world - 1:
            sends.append((dist.isend(total, dst=ranks[rank + 1], group=group), total))  # kept alive until sent
        else:
            out[lo:hi] = total.to(out_dtype)
    for work, _ in sends:
        work.wait()
    dist.broadcast(out, src=ranks[-1], group=group)
    return out


def _checked(total: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    if total.dtype != torch.float32 or tuple(total.shape) != (rows, cols):
        raise OpInputError(OP, f"a chain step must return the fp32 running sum [{rows}, {cols}]; got "
                               f"{total.dtype} {tuple(total.shape)}")
    return total
