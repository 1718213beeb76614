"""Strict attention: close to fp64; packing-invariant; prefill == chunked prefill == paged decode.

A small contract (split 64, block 16) makes 150-token sequences cross two split and nine block
boundaries cheaply; the default contract (split 256, block 32) is checked on a 300-token sequence.
"""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.contract import AttentionSpec
from rlkit.kernels import attention, attention_kernel
from rlkit.kernels.errors import OpInputError
from rlkit.types import AttentionLayout
from tests.kernels.tolerances import REL_TOL, rel_err
from tests.negative import require_native_difference

SMALL = NumericsContract.default().replace(attention=AttentionSpec(split_size=64, block_size=16))
DEFAULT = NumericsContract.default()
H, KVH, D = 4, 2, 32


def seq(n, dtype=torch.bfloat16, g=None):
    return tuple(torch.randn(n, h, D, generator=g).to(dtype) for h in (H, KVH, KVH))


def prefill(contract, seqs):
    q = torch.cat([s[0] for s in seqs]); k = torch.cat([s[1] for s in seqs]); v = torch.cat([s[2] for s in seqs])
    cu = torch.tensor([0] + [len(s[0]) for s in seqs]).cumsum(0)
    return attention.reference(q, k, v, AttentionLayout.prefill(cu), contract)


class PagedCache:
    """A tiny paged KV cache with pages handed out in a shuffled order (layout must not matter)."""

    def __init__(self, pages=64, page_size=8, dtype=torch.bfloat16):
        self.k = torch.full((pages, page_size, KVH, D), float("nan"), dtype=dtype)  # unwritten = NaN
        self.v = torch.full_like(self.k, float("nan"))
        self.free = torch.randperm(pages).tolist()
        self.page = page_size
        self.tables = {}

    def write(self, sid, start, k, v):
        table = self.tables.setdefault(sid, [])
        for j in range(k.shape[0]):
            pos = start + j
            while pos // self.page >= len(table):
                table.append(self.free.pop())
            self.k[table[pos // self.page], pos % self.page] = k[j]
            self.v[table[pos // self.page], pos % self.page] = v[j]

    def block_table(self, sids):
        width = max(len(self.tables[s]) for s in sids)
        return torch.tensor([self.tables[s] + [0] * (width - len(self.tables[s])) for s in sids])


def paged_attend(cache, contract, q, sids, q_lens, ctx):
    layout = AttentionLayout.paged(torch.tensor(q_lens), torch.tensor(ctx), cache.block_table(sids))
    return attention.reference(q, cache.k, cache.v, layout, contract)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_close_to_fp64(dtype):
    q, k, v = seq(70, dtype)
    out = prefill(SMALL, [(q, k, v)])
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    kd, vd = kd.repeat_interleave(H // KVH, 0), vd.repeat_interleave(H // KVH, 0)
    s = qd @ kd.transpose(1, 2) * D ** -0.5
    s = s.masked_fill(torch.ones(70, 70, dtype=torch.bool).triu(1), float("-inf"))
    ref = (torch.softmax(s, -1) @ vd).transpose(0, 1)
    assert rel_err(out, ref) < REL_TOL[dtype]


def test_packing_invariance_same_sequence_different_neighbours():
    a, b, c = seq(150), seq(37), seq(90)
    alone = prefill(SMALL, [a])
    assert_bitwise_equal(prefill(SMALL, [b, a, c])[37 : 37 + 150], alone, "A between B and C vs alone")
    assert_bitwise_equal(prefill(SMALL, [a, c])[:150], alone, "A before C vs alone")


@pytest.mark.parametrize("contract, length", [(SMALL, 150), (DEFAULT, 300)])
def test_prefill_equals_chunked_prefill_equals_paged_decode(contract, length):
    q, k, v = seq(length)
    other = seq(45)
    full = prefill(contract, [(q, k, v)])

    # chunked prefill: three uneven chunks, each written into the paged cache before attending
    cache = PagedCache(pages=96)
    outs, start = [], 0
    for end in (50, 117, length):
        cache.write(0, start, k[start:end], v[start:end])
        outs.append(paged_attend(cache, contract, q[start:end], [0], [end - start], [end]))
        start = end
    assert_bitwise_equal(torch.cat(outs), full, "chunked prefill vs prefill")

    # decode: one query at a time, batched beside another sequence that is also decoding
    cache = PagedCache(pages=96)
    cache.write(1, 0, other[1], other[2])
    dec = []
    for p in range(length):
        cache.write(0, p, k[p : p + 1], v[p : p + 1])
        both = paged_attend(cache, contract, torch.cat([q[p : p + 1], other[0][44:45]]), [0, 1], [1, 1], [p + 1, 45])
        dec.append(both[:1])
    assert_bitwise_equal(torch.cat(dec), full, "paged decode vs prefill")


def test_native_decode_differs_from_native_prefill():
    """Negative control: torch SDPA computes a decode query with another blocking than the same query
    inside a causal prefill; the counts of differing elements are printed."""
    q, k, v = seq(150, torch.float32)
    cu = torch.tensor([0, 150])
    full = attention.native(q, k, v, AttentionLayout.prefill(cu))
    cache = PagedCache(pages=32, dtype=torch.float32)
    cache.write(0, 0, k, v)
    dec = []
    for p in range(150):
        layout = AttentionLayout.paged(torch.tensor([1]), torch.tensor([p + 1]), cache.block_table([0]))
        dec.append(attention.native(q[p : p + 1], cache.k, cache.v, layout))
    report = compare(torch.cat(dec), full, "native decode vs native prefill")
    require_native_difference(report.differing, str(report))


@pytest.mark.parametrize("contract", [SMALL, DEFAULT])
def test_decode_layout_equals_the_general_paged_layout(contract):
    """AttentionLayout.paged_decode (what the engine's decode steps and CUDA graphs use: sized by the
    block table, no host read) gives the bits of AttentionLayout.paged with one query a sequence; the
    native batched decode over a NaN-filled cache stays finite and close to native per-sequence SDPA."""
    g = torch.Generator().manual_seed(4)
    seqs = [seq(n, torch.float32, g) for n in (3, 70, 129)]
    cache = PagedCache(pages=64, dtype=torch.float32)
    for i, (_, k, v) in enumerate(seqs):
        cache.write(i, 0, k, v)
    q = torch.cat([s[0][-1:] for s in seqs])
    ctx = torch.tensor([len(s[0]) for s in seqs])
    table = cache.block_table([0, 1, 2])
    table = torch.cat([table, torch.zeros(3, 2, dtype=table.dtype)], 1)  # wider than any context needs
    general = AttentionLayout.paged(torch.ones(3, dtype=torch.int64), ctx, table)
    decode = AttentionLayout.paged_decode(ctx, table)
    assert_bitwise_equal(attention.reference(q, cache.k, cache.v, decode, contract),
                         attention.reference(q, cache.k, cache.v, general, contract), "decode vs paged layout")
    batched = attention.native(q, cache.k, cache.v, decode)
    per_seq = attention.native(q, cache.k, cache.v, general)
    assert torch.isfinite(batched).all() and rel_err(batched, per_seq) < REL_TOL[torch.float32]
    with pytest.raises(OpInputError, match="one query per sequence"):
        attention.reference(torch.cat([q, q[:1]]), cache.k, cache.v, decode, contract)


def test_bad_inputs():
    q, k, v = seq(10)
    with pytest.raises(OpInputError, match="cu_seqlens_q"):
        attention.reference(q, k, v, AttentionLayout.prefill(torch.tensor([0, 9])), SMALL)
    with pytest.raises(OpInputError, match="heads must be a multiple of kv_heads"):
        attention.reference(torch.randn(10, 3, D).bfloat16(), k, v, AttentionLayout.prefill(torch.tensor([0, 10])), SMALL)
    with pytest.raises(OpInputError, match="too few pages"):
        cache = PagedCache(pages=4)
        cache.write(0, 0, k, v)
        layout = AttentionLayout.paged(torch.tensor([1]), torch.tensor([40]), cache.block_table([0]))
        attention.reference(q[:1], cache.k, cache.v, layout, SMALL)


def test_a_checked_layout_is_checked_again_for_other_shapes():
    """check_inputs reads a layout's values once for a token count: a layout that passed with 10 tokens
    still refuses 9, and a fresh layout is read again."""
    q, k, v = seq(10)
    layout = AttentionLayout.prefill(torch.tensor([0, 4, 10]))
    attention.native(q, k, v, layout)
    with pytest.raises(OpInputError, match="cu_seqlens_q"):
        attention.native(q[:9], k[:9], v[:9], layout)
    with pytest.raises(OpInputError, match="cu_seqlens_q"):
        attention.native(q, k, v, AttentionLayout.prefill(torch.tensor([0, 4, 9])))
    assert attention.host_bounds(layout) == {"cu_q": [0, 4, 10], "query_start": [0, 0], "context_lens": [4, 6],
                                             "cu_k": [0, 4, 10]}


def test_launch_plan_cache_keys_the_layout_weakly():
    """The host-side launch plan is reused for every layer of a forward (same layout object, same
    shapes) and dropped with its layout; it holds no reference back to the layout."""
    import gc

    c = NumericsContract.default()
    q, k = torch.randn(10, 4, 16), torch.randn(10, 2, 16)
    layout = AttentionLayout.prefill(torch.tensor([0, 4, 10]))
    plan = attention.attention_plan(q.shape, k, layout, c)
    assert attention.attention_plan(q.shape, k, layout, c) is plan
    assert attention.attention_plan(q.shape, k, layout, c, mode="split") is not plan
    assert all(v is not layout for v in plan.values())
    n = len(attention_kernel._PLAN_CACHE)
    del layout
    gc.collect()
    assert len(attention_kernel._PLAN_CACHE) == n - 1


def test_plan_runs_whole_blocks_unmasked_except_in_the_split_decode():
    """Prefill and the fused decode run the key blocks a tile sees whole without masks
    (attention_kernel.UNMASKED_FULL), the split-parallel decode with them (UNMASKED_FULL_SPLIT: faster
    there on the H200); an explicit choice is kept. The two forms give the same bits (tests/gpu)."""
    c = NumericsContract.default()
    q, k = torch.randn(10, 4, 16), torch.randn(10, 2, 16)
    prefill = AttentionLayout.prefill(torch.tensor([0, 4, 10]))
    assert attention.attention_plan(q.shape, k, prefill, c)["unmasked_full"] is attention_kernel.UNMASKED_FULL is True
    pages = torch.randn(8, 16, 2, 16)
    decode = AttentionLayout.paged_decode(torch.tensor([700, 30]), torch.arange(2 * 44).reshape(2, 44) % 8)
    dq = torch.randn(2, 4, 16)
    split = attention.attention_plan(dq.shape, pages, decode, c, mode="split")
    fused = attention.attention_plan(dq.shape, pages, decode, c, mode="fused")
    assert (split["mode"], split["unmasked_full"]) == ("split", attention_kernel.UNMASKED_FULL_SPLIT)
    assert attention_kernel.UNMASKED_FULL_SPLIT is False
    assert (fused["mode"], fused["unmasked_full"]) == ("fused", True)
    assert attention.attention_plan(dq.shape, pages, decode, c, mode="split", unmasked_full=True)["unmasked_full"]


def test_longest_first_plans_list_the_same_tiles_most_visible_keys_first():
    """A prefill plan may list each sequence's query tiles longest first (the SMs then start the causal
    mask's longest programs first): the same (sequence, first query) tiles, sequences in order, each one's
    by last position, descending; in position order otherwise."""
    c = NumericsContract.default()
    q, k = torch.randn(300, 32, 16), torch.randn(64, 16, 8, 16)  # k: 64 pages of 16 positions
    layout = AttentionLayout.paged(torch.tensor([100, 200]), torch.tensor([600, 200]),
                                   torch.arange(2 * 40).reshape(2, 40) % 64)  # the first a chunk from 500
    plain = attention.attention_plan(q.shape, k, layout, c, longest_first=False)
    first = attention.attention_plan(q.shape, k, layout, c, longest_first=True)
    tiles = lambda p: list(zip(p["tile_seq"].tolist(), p["tile_q0"].tolist()))  # noqa: E731
    bq = attention.PREFILL_TILE[0] // 4
    assert tiles(plain) == [(0, q0) for q0 in range(0, 100, bq)] + [(1, q0) for q0 in range(0, 200, bq)]
    starts = layout.query_start.tolist()
    lens = (layout.cu_seqlens_q[1:] - layout.cu_seqlens_q[:-1]).tolist()
    assert [s for s, _ in tiles(first)] == [s for s, _ in tiles(plain)], tiles(first)  # sequences in order
    for seq in (0, 1):
        last = [starts[s] + min(q0 + bq, lens[s]) - 1 for s, q0 in tiles(first) if s == seq]
        assert last == sorted(last, reverse=True) and len(set(last)) == len(last), (seq, last)
    assert sorted(tiles(first)) == sorted(tiles(plain))
    assert (first["max_splits"], first["tiles"]) == (plain["max_splits"], plain["tiles"])
    assert plain["longest_first"] is False and first["longest_first"] is True
    assert attention.attention_plan(q.shape, k, layout, c)["longest_first"] is attention_kernel.LONGEST_FIRST


def test_paged_key_rows_pack_each_sequences_keys_in_position_order():
    """The native paged prefill's gather (one index_select over the flattened cache): segment i of the
    packed keys is sequence i's keys at positions 0..context-1, the values `gather_keys` reads page by
    page, and cu_seqlens_k counts them."""
    from rlkit.kernels import attention_native

    torch.manual_seed(5)
    cache = PagedCache()
    lens = {"a": 37, "b": 8, "c": 1, "d": 70}
    for sid, n in lens.items():
        _, k, v = seq(n)
        cache.write(sid, 0, k, v)
    sids = list(lens)
    q_lens = [37, 3, 1, 16]  # a from 0; b, c, d chunks ending at their last token
    layout = AttentionLayout.paged(torch.tensor(q_lens), torch.tensor([lens[s] for s in sids]), cache.block_table(sids))
    bounds = attention.host_bounds(layout)
    rows, cu_k = attention_native._paged_key_rows(layout, cache.page, bounds)
    assert cu_k.dtype == torch.int32 and cu_k.tolist() == [0, 37, 45, 46, 116]
    packed_k, packed_v = cache.k.flatten(0, 1)[rows], cache.v.flatten(0, 1)[rows]
    for i, sid in enumerate(sids):
        kk, vv = attention.gather_keys(cache.k, cache.v, layout, i, bounds)
        lo, hi = cu_k[i].item(), cu_k[i + 1].item()
        assert_bitwise_equal(packed_k[lo:hi], kk, f"keys of {sid}")
        assert_bitwise_equal(packed_v[lo:hi], vv, f"values of {sid}")
    assert attention_native._paged_key_rows(layout, cache.page, bounds)[0] is rows, "built once a layout"
