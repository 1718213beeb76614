"""Strict all-reduce: gather every rank's fp32 partial, combine them in rank order by the canonical tree.

Contract (CollectiveSpec): the wire carries fp32 partials (a rank's GEMM subtree result, unrounded);
every rank receives all of them and computes the same pairwise tree (kernels/tree.py) in rank order, so
every rank holds the same bits, and those bits equal the single-process tree over the same partials.
Never a ring or the library's algorithm choice, whose order depends on the world size and the transport.

Works over any torch.distributed process group (gloo on the CPU, NCCL on GPUs).
"""

from __future__ import annotations

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
