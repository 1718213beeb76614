"""The canonical pairwise tree: the reduction order the strict path uses for every sum it splits,
and the sequential sum, the one other order a contract may name (`gemm.chunk_merge`).

Level by level, adjacent pairs are added, (x0 + x1), (x2 + x3), ...; an odd element at the end of a level
is carried up unchanged. Every add is a single IEEE fp32 add, so the result is a fixed function of the
inputs and their order: it cannot depend on how many rows sit beside them, or on the backend's blocking.

Two properties the contract relies on:
- subtree alignment: for 2^a leaves split into 2^b contiguous equal groups, the tree of the group results
  equals the tree of all leaves (GEMM K chunks over TP ranks, attention splits);
- trailing empties: a tree over n items equals the tree over N > n items whose last N - n are "empty"
  (exact pass-through), which lets a vectorized prefill evaluate every query against the same
  maximal schedule as a decode step that only sees its own splits.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")


def pairwise_reduce(items: Sequence[T], combine: Callable[[T, T], T]) -> T:
    """Reduce a non-empty list with `combine` in the canonical pairwise order."""
    if not items:
        raise ValueError("pairwise_reduce needs at least one item")
    level = list(items)
    while len(level) > 1:
        nxt = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def pairwise_sum(items: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of tensors (e.g. GEMM chunk partials, per-rank partials) in the canonical tree."""
    return pairwise_reduce(items, torch.add)


def sequential_sum(items: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of tensors added in order, ((x0 + x1) + x2) + ...: the other merge rule a contract may name
    (GEMM chunk partials from contract version 5), which a kernel evaluates with one running sum."""
    if not items:
        raise ValueError("sequential_sum needs at least one item")
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def pairwise_sum_dim(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over one dimension in the canonical tree, built from elementwise adds (no torch reduction,
    whose order depends on shapes and threads). The dimension is removed."""
    x = x.movedim(dim, -1)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        even = n - n % 2
        paired = x[..., 0:even:2] + x[..., 1:even:2]
        if n % 2:
            paired = torch.cat([paired, x[..., n - 1 : n]], dim=-1)
        x = paired
    return x[..., 0]
