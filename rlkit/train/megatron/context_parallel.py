"""Context parallelism for the Megatron trainer: a packed batch split across CP ranks, bit for bit CP 1.

Why it is rlkit's own: Megatron-core's context parallelism lives in Transformer Engine's attention
(TEDotProductAttention with a CP group: p2p ring, all-to-all or all-gather) and its token split in TE's
`thd_get_partitioned_indices`. Neither exists on the CPU machines (no Transformer Engine), and TE's
kernels would not follow the numerics contract anyway. So, as for tensor parallelism, Megatron keeps the
structure (`context_parallel_size` in the TransformerConfig, its CP process groups, cp_comm_type
"all_gather" handed to the core-attention slot) and rlkit decides every bit:

- the split (`ContextSplit`): each packed sequence is cut into 2 x CP chunks and CP rank r holds chunks
  r and 2CP-1-r (Megatron's load-balanced causal split); chunk boundaries are floor(j * len / (2 CP)), so
  no sequence length has to divide by anything (a short sequence just leaves some chunks empty);
- positions are global: a token keeps its absolute position in its sequence (RoPE reads it);
- attention over the full causal context: every rank all-gathers K and V (after RoPE) in token order and
  runs `ops.attention` for its own query chunks, each chunk a layout with query_start = its first
  position against the keys 0..its last position. Under the contract a query's result depends only on
  its q, the keys at positions 0..p and the fixed split/block schedule (kernels/attention.py), so every
  query gets the CP-1 bits whatever the CP degree;
- the per-token ops (norms, GEMMs, SwiGLU, the lm_head and the log-softmax) are row-invariant under the
  contract, so they need nothing;
- logprobs are gathered in token order (`gather_rows(..., replicated_consumer=True)`): every rank then
  computes the same loss over all response tokens;
- gradients: the K/V gather's backward sums every rank's partial gradient of the keys by the canonical
  all-reduce (`ops.all_reduce`: fp32, the pairwise tree in rank order) and keeps this rank's rows (a
  tree-ordered reduce-scatter); the parameters' gradients are summed over the CP group the same way by
  the trainer, so every CP rank holds the same bits after an update.

Run: `python -m pytest -q tests/train/test_layout_matrix.py` (the trainer layout x rollout TP matrix).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist

from rlkit import ops
from rlkit.types import AttentionLayout


@dataclass(frozen=True)
class ContextSplit:
    """Which tokens of one pack (sequences of `lens`, packed back to back) CP rank `rank` of `size` holds."""

    lens: tuple[int, ...]
    size: int
    rank: int

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"context parallel rank {self.rank} of size {self.size}: need 0 <= rank < size")
        idle = [r for r in range(self.size) if not self.segments(r)]
        if idle:  # every rank of the group computes this, so all of them refuse the pack together
            raise ValueError(f"CP {self.size}: a pack of sequences of lengths {list(self.lens)} leaves CP "
                             f"rank(s) {idle} without a token (each sequence is cut into {2 * self.size} "
                             f"chunks); pack more or longer sequences, or use a smaller CP")

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """Where each sequence begins in the pack."""
        out, at = [], 0
        for n in self.lens:
            out.append(at)
            at += n
        return tuple(out)

    @property
    def total(self) -> int:
        return sum(self.lens)

    def segments(self, rank: int | None = None) -> list[tuple[int, int, int]]:
        """(sequence, first position, end position) of each non-empty run of tokens `rank` holds, in pack
        order; adjacent chunks of a sequence are one run."""
        rank = self.rank if rank is None else rank
        parts = 2 * self.size
        out: list[tuple[int, int, int]] = []
        for i, n in enumerate(self.lens):
            for c in (rank, parts - 1 - rank):
                a, b = c * n // parts, (c + 1) * n // parts
                if a == b:
                    continue
                if out and out[-1][0] == i and out[-1][2] == a:
                    out[-1] = (i, out[-1][1], b)
                else:
                    out.append((i, a, b))
        return out

    def owned(self, rank: int | None = None) -> torch.Tensor:
        """Pack indices of the tokens `rank` holds, in its local order (ascending)."""
        idx = [torch.arange(self.starts[i] + a, self.starts[i] + b) for i, a, b in self.segments(rank)]
        return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.int64)

    def positions(self) -> torch.Tensor:
        """Absolute in-sequence position of each local token (RoPE reads these)."""
        pos = [torch.arange(a, b) for _, a, b in self.segments()]
        return torch.cat(pos) if pos else torch.zeros(0, dtype=torch.int64)

    def local_cu_seqlens(self) -> torch.Tensor:
        """Cumulative lengths of this rank's runs (Megatron's thd cu_seqlens for the local tokens)."""
        lens = torch.tensor([b - a for _, a, b in self.segments()], dtype=torch.int64)
        cu = torch.zeros(lens.numel() + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(lens, 0)
        return cu

    def attention_inputs(self, k_full: torch.Tensor, v_full: torch.Tensor):
        """For each local run (sequence i, positions a..b-1): its queries against the keys of positions
        0..b-1 of sequence i, from the gathered pack-order K/V. Returns (k, v, layout)."""
        segs = self.segments()
        ks = [k_full[self.starts[i] : self.starts[i] + b] for i, _, b in segs]
        vs = [v_full[self.starts[i] : self.starts[i] + b] for i, _, b in segs]
        dev = k_full.device
        q_lens = torch.tensor([b - a for _, a, b in segs], dtype=torch.int64, device=dev)
        ctx = torch.tensor([b for _, _, b in segs], dtype=torch.int64, device=dev)
        cu_q = torch.zeros(len(segs) + 1, dtype=torch.int64, device=dev)
        cu_q[1:] = torch.cumsum(q_lens, 0)
        cu_k = torch.zeros(len(segs) + 1, dtype=torch.int64, device=dev)
        cu_k[1:] = torch.cumsum(ctx, 0)
        layout = AttentionLayout(cu_seqlens_q=cu_q, query_start=ctx - q_lens, context_lens=ctx, cu_seqlens_k=cu_k)
        return torch.cat(ks), torch.cat(vs), layout


class _GatherRows(torch.autograd.Function):
    """Rows held by the ranks of `group` -> all rows in pack order, on every rank.

    Backward, `replicated_consumer` True: every rank computed the same function of the gathered rows (the
    loss), so its gradient is already the whole gradient: keep this rank's rows. False: each rank used the
    rows differently (its own queries against all keys), so the partial gradients are summed over the
    group by the contract's all-reduce (canonical tree in rank order, fp32) and this rank keeps its rows."""

    @staticmethod
    def forward(ctx, local, indices, total, group, replicated_consumer):
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        width = max(int(i.numel()) for i in indices)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded.contiguous(), group=group)
        out = local.new_empty((total, *local.shape[1:]))
        for r, idx in enumerate(indices):
            out[idx.to(out.device)] = parts[r][: idx.numel()]
        ctx.mine = indices[rank]
        ctx.group, ctx.replicated = group, replicated_consumer
        ctx.contract = ops.current_contract()
        return out

    @staticmethod
    def backward(ctx, dy):
        mine = ctx.mine.to(dy.device)
        if ctx.replicated:
            return dy[mine], None, None, None, None
        with ops.use_contract(ctx.contract):
            summed = ops.all_reduce(dy.float(), group=ctx.group)
        return summed[mine].to(dy.dtype), None, None, None, None


def gather_rows(local: torch.Tensor, split: ContextSplit, group, *, replicated_consumer: bool,
                indices: list[torch.Tensor] | None = None, total: int | None = None) -> torch.Tensor:
    """All ranks' rows in pack order (`indices[r]`: the pack rows rank r holds; default the split's token
    ownership). See _GatherRows for the two backward semantics."""
    indices = indices if indices is not None else [split.owned(r) for r in range(split.size)]
    total = split.total if total is None else total
    covered = torch.cat(indices)
    if covered.numel() != total or not torch.equal(covered.sort().values, torch.arange(total)):
        raise ValueError(f"CP gather: the ranks' rows do not cover 0..{total - 1} exactly once")
    return _GatherRows.apply(local, indices, total, group, replicated_consumer)


def response_rows(split: ContextSplit, prompt_lens: list[int], rank: int | None = None):
    """The local rows that predict a response token, grouped by sequence: [(sequence j in the pack,
    local row indices, target positions)], and the flat pack response index of each such row (in local
    order). Row at position t of sequence j predicts token t + 1 when prompt_len - 1 <= t <= len - 2."""
    rank = split.rank if rank is None else rank
    groups, flat = [], []
    offsets, at = [], 0
    for n, p in zip(split.lens, prompt_lens):
        offsets.append(at)
        at += n - p
    row = 0
    by_seq: dict[int, tuple[list[int], list[int]]] = {}
    for j, a, b in split.segments(rank):
        p, n = prompt_lens[j], split.lens[j]
        for t in range(a, b):
            if p - 1 <= t <= n - 2:
                rows, targets = by_seq.setdefault(j, ([], []))
                rows.append(row)
                targets.append(t + 1)
                flat.append(offsets[j] + t - (p - 1))
            row += 1
    for j in sorted(by_seq):
        rows, targets = by_seq[j]
        groups.append((j, torch.tensor(rows, dtype=torch.int64), torch.tensor(targets, dtype=torch.int64)))
    return groups, torch.tensor(flat, dtype=torch.int64), at
