"""all_reduce over 1, 2 and 4 gloo ranks equals the single-process canonical sum; a row-parallel
linear at TP 1, 2 and 4 gives identical bits (layout invariance); native all-reduce as the control."""

import pytest
import torch
import torch.distributed as dist

from rlkit import NumericsContract, ops
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.kernels.collectives import canonical_sum, chain_blocks
from tests.distributed import run_ranks


def _partials(world):
    g = torch.Generator().manual_seed(11)
    return [torch.randn(64, 96, generator=g) * (10 ** (r % 3)) for r in range(world)]


def _all_reduce_rank(rank, world, path):
    with ops.use_contract(NumericsContract.default().with_ops(all_reduce=path)):
        return ops.all_reduce(_partials(world)[rank])


def _row_parallel_rank(rank, world, path, name=None):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 256, generator=g).bfloat16()
    w = torch.randn(80, 256, generator=g).bfloat16()
    k = 256 // world
    contract = NumericsContract.named(name) if name else NumericsContract.default()
    with ops.use_contract(contract.with_ops(linear=path, all_reduce=path)):
        return ops.linear(x[:, rank * k : (rank + 1) * k], w[:, rank * k : (rank + 1) * k], row_parallel=True,
                          tp_group=dist.group.WORLD, tp_size=world)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_strict_all_reduce_equals_canonical_sum(world):
    expected = canonical_sum(_partials(world))
    for rank, got in enumerate(run_ranks(world, _all_reduce_rank, "strict")):
        assert_bitwise_equal(got, expected, f"rank {rank} of {world}")


@pytest.mark.parametrize("name", ["qwen3-dense-strict-v5", "qwen3-dense-strict-v6"])
def test_row_parallel_linear_is_layout_invariant(name):
    """v5: the ranks gather their chunk sums and merge them in order; v6: they pass one running sum on
    in rank order (collectives.chain), the last rank broadcasting the rounded result."""
    results = {w: run_ranks(w, _row_parallel_rank, "strict", name) for w in (1, 2, 4)}
    tp1 = results[1][0]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 256, generator=g).bfloat16()
    w = torch.randn(80, 256, generator=g).bfloat16()
    with ops.use_contract(NumericsContract.named(name)):
        alone = ops.linear(x, w, row_parallel=True)
    assert_bitwise_equal(tp1, alone, "TP1 under gloo vs plain strict linear")
    for world in (2, 4):
        for rank, got in enumerate(results[world]):
            assert_bitwise_equal(got, tp1, f"TP{world} rank {rank} vs TP1")


def _v6_native_reduce_rank(rank, world):
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(37, 256, generator=g).bfloat16(), torch.randn(80, 256, generator=g).bfloat16()
    k = 256 // world
    with ops.use_contract(NumericsContract.named("qwen3-dense-strict-v6").with_ops(all_reduce="native")):
        return ops.linear(x[:, rank * k : (rank + 1) * k], w[:, rank * k : (rank + 1) * k], row_parallel=True,
                          tp_group=dist.group.WORLD, tp_size=world)


def test_v6_strict_linear_with_native_all_reduce_sums_each_ranks_own_chain():
    """v6 with the all_reduce op native: each rank's chain from zero over its K slice, summed by the
    backend (the control path: no bitwise claim across TP sizes); every rank holds the same result,
    close to TP 1's."""
    tp1, tp4 = run_ranks(1, _v6_native_reduce_rank)[0], run_ranks(4, _v6_native_reduce_rank)
    assert all(torch.equal(t, tp4[0]) for t in tp4)
    assert float((tp4[0].float() - tp1.float()).abs().max()) < 0.1


def test_native_row_parallel_differs_from_tp1():
    """Negative control: a local bf16 GEMM per rank plus gloo's bf16 all-reduce: TP4 vs TP1."""
    tp1 = run_ranks(1, _row_parallel_rank, "native")[0]
    tp4 = run_ranks(4, _row_parallel_rank, "native")
    report = compare(tp4[0], tp1, "native TP4 vs TP1")
    print(report)
    assert report.differing > 0


@pytest.mark.parametrize("rows, world", [(0, 2), (1, 4), (5, 4), (37, 2), (37, 4), (8192, 4)])
def test_chain_blocks_cover_every_row_once_in_order(rows, world):
    """The v6 chain's pipeline blocks: contiguous, in order, every row once, at most 2 x world of them."""
    blocks = chain_blocks(rows, world)
    assert blocks[0][0] == 0 and blocks[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert len(blocks) <= max(1, 2 * world) and all(hi > lo for lo, hi in blocks if rows)
