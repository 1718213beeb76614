"""Context parallelism's pieces in one process: the split of a pack over CP ranks, and the claim the
layout rests on, that a CP rank's queries against the gathered keys give the bits of the whole prefill.

`ContextSplit` cuts each sequence into 2 x CP chunks (rank r: chunks r and 2CP-1-r). Each rank's runs,
evaluated by `ops.attention` against the keys 0..p of their sequences (`ContextSplit.attention_inputs`,
what StrictCoreAttention does after the K/V all-gather), must equal the rows of the unsplit packed
prefill bit for bit, for every CP degree, lengths either side of the contract's split size included.
The multi-process path (gathers, gradients, Megatron, the native control) is
tests/train/test_layout_matrix.py.
"""

from __future__ import annotations

import pytest
import torch

from rlkit import NumericsContract, ops
from rlkit.bitwise import assert_bitwise_equal
from rlkit.train.megatron.context_parallel import ContextSplit, response_rows
from rlkit.types import AttentionLayout

pytestmark = pytest.mark.megatron

STRICT = NumericsContract.default()


def _packed_qkv(lens, heads=4, kv_heads=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k, v = (torch.randn(t, h, d, generator=g).to(torch.bfloat16) for h in (heads, kv_heads, kv_heads))
    cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return q, k, v, AttentionLayout.prefill(cu)


def _split_attention(q, k, v, lens, cp):
    """Every CP rank's output rows, put back in pack order."""
    out = torch.empty_like(q)
    for rank in range(cp):
        split = ContextSplit(tuple(lens), cp, rank)
        own = split.owned()
        keys, values, layout = split.attention_inputs(k, v)
        out[own] = ops.attention(q[own], keys, values, layout)
    return out


# lengths: short ones with empty chunks, and ones past the default split size (256) so a query's splits
# are merged by the tree in both layouts
LENS = [(3, 2, 17), (40, 5, 300), (257, 9)]


@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("lens", LENS)
def test_split_queries_against_gathered_keys_equal_the_whole_prefill(lens, cp):
    q, k, v, layout = _packed_qkv(lens)
    with ops.use_contract(STRICT):
        whole = ops.attention(q, k, v, layout)
        split = _split_attention(q, k, v, lens, cp)
    assert_bitwise_equal(split, whole, f"CP {cp} over lengths {lens} vs the whole prefill")


@pytest.mark.parametrize("cp", [1, 2, 3])
def test_split_covers_every_token_once_load_balanced(cp):
    lens = (12, 7, 30)
    parts = [ContextSplit(lens, cp, r) for r in range(cp)]
    owned = torch.cat([p.owned() for p in parts])
    assert torch.equal(owned.sort().values, torch.arange(sum(lens)))
    sizes = [p.owned().numel() for p in parts]
    assert max(sizes) - min(sizes) <= 2 * len(lens), sizes  # at most one token a chunk apart
    for p in parts:  # positions are absolute in-sequence positions, and ascend in pack order
        starts = torch.tensor(p.starts).repeat_interleave(torch.tensor(lens))
        assert torch.equal(p.positions(), p.owned() - starts[p.owned()])
    if cp == 2:  # rank 0 holds chunks 0 and 3 of each sequence: [0, 3) and [9, 12) of the first
        assert parts[0].segments()[:2] == [(0, 0, 3), (0, 9, 12)]


def test_response_rows_cover_every_response_token_once():
    lens, prompts = (12, 7, 30), [5, 6, 1]
    total, flat = None, []
    for r in range(2):
        groups, idx, total = response_rows(ContextSplit(lens, 2, r), prompts)
        flat.append(idx)
        for j, rows, targets in groups:  # a row at position t predicts t + 1, a response token
            assert bool((targets >= prompts[j]).all() and (targets < lens[j]).all())
    assert total == sum(n - p for n, p in zip(lens, prompts))
    assert torch.equal(torch.cat(flat).sort().values, torch.arange(total))


def test_a_pack_that_leaves_a_rank_empty_is_refused():
    with pytest.raises(ValueError, match=r"CP 4: a pack of sequences of lengths \[3\] leaves CP rank\(s\) \[1"):
        ContextSplit((3,), 4, 0)
    with pytest.raises(ValueError, match="rank 2 of size 2"):
        ContextSplit((8,), 2, 2)
