"""Strict logprobs: close to fp64 log_softmax; row-invariant; raw and processed semantics.

A contract with row_block 8 and vocab_chunk 1000 makes small calls cross the row-block threshold (7, 8, 9,
17 rows) and the vocab-chunk merge (including a shorter last chunk) cheaply.
"""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.contract import LogprobSpec
from rlkit.kernels import logprob
from rlkit.kernels.errors import OpInputError
from rlkit.types import SamplingParams

SMALL = NumericsContract.default().replace(logprob=LogprobSpec(vocab_chunk=1000, row_block=8))
V, HID = 4321, 64


def make(rows, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, HID, generator=g).to(dtype)
    w = (torch.randn(V, HID, generator=g) / 2).to(dtype)
    ids = torch.randint(0, V, (rows,), generator=g)
    return h, w, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_close_to_fp64(dtype):
    h, w, ids = make(20, dtype)
    out = logprob.reference(h, w, ids, SMALL)
    ref = torch.log_softmax(h.double() @ w.double().T, -1).gather(-1, ids[:, None]).squeeze(-1)
    assert float((out.double() - ref).abs().max()) < 1e-4


def test_full_qwen3_vocab_close_to_fp64():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, 64, generator=g)
    w = torch.randn(151_936, 64, generator=g) / 8
    ids = torch.randint(0, 151_936, (5,), generator=g)
    out = logprob.reference(h, w, ids, NumericsContract.default())
    ref = torch.log_softmax(h.double() @ w.double().T, -1).gather(-1, ids[:, None]).squeeze(-1)
    assert float((out.double() - ref).abs().max()) < 1e-4


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 17])
@pytest.mark.parametrize("params", [None, SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=50)])
def test_row_alone_equals_row_in_batch(rows, params):
    h, w, ids = make(17)
    batch = logprob.reference(h[:rows], w, ids[:rows], SMALL, params)
    r = rows - 1
    alone = logprob.reference(h[r : r + 1], w, ids[r : r + 1], SMALL, params)
    assert_bitwise_equal(batch[r : r + 1], alone, f"row {r} of {rows}")


def test_hidden_path_equals_logits_path():
    """The trainer's fused path (hidden -> logprob) and the engine's (logits, then logprob) agree."""
    h, w, ids = make(19)
    params = SamplingParams(temperature=0.7, top_p=0.9)
    for p in (None, params):
        fused = logprob.reference(h, w, ids, SMALL, p)
        two_step = logprob.from_logits(logprob.logits(h, w, SMALL), ids, SMALL, p)
        assert_bitwise_equal(fused, two_step, f"fused vs two-step, params={p}")


def test_processed_semantics_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    ids = torch.arange(6)
    def lp(params):
        return torch.stack([logprob.from_logits(logits, ids[i : i + 1], SMALL, params)[0] for i in range(6)])
    k3 = lp(SamplingParams(top_k=3))
    assert torch.isinf(k3[3:]).all() and torch.isfinite(k3[:3]).all()
    assert abs(float(k3[:3].exp().sum()) - 1) < 1e-6
    probs = torch.softmax(logits[0].double() / 0.5, -1)
    # top_p 0.9 at temperature 0.5: keep the shortest prefix whose mass before it is < 0.9
    keep = (torch.cumsum(probs, 0) - probs) < 0.9
    p9 = lp(SamplingParams(temperature=0.5, top_p=0.9))
    assert torch.equal(torch.isfinite(p9), keep)
    expect = torch.log(probs[keep] / probs[keep].sum())
    assert float((p9[keep].double() - expect).abs().max()) < 1e-6


def test_native_logprob_vs_strict():
    """Negative control: the native path rounds logits to bf16 and uses the backend GEMM and
    log_softmax; against the strict path many tokens differ."""
    h, w, ids = make(33)
    report = compare(logprob.native(h, w, ids, SMALL), logprob.reference(h, w, ids, SMALL), "native vs strict")
    print(report)
    assert report.differing > 0


def _unchunked_native_with_grads(h, w, ids, params, g):
    hh, ww = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    out = logprob.native_from_logits(logprob.native_logits(hh, ww), ids, SMALL, params)
    out.backward(g)
    return out.detach(), hh.grad, ww.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [None, SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=50)])
def test_native_chunked_matches_unchunked_values_and_gradients(dtype, params):
    """The chunked native logprob (8-row chunks over 21 rows: a short last chunk) against the one-call
    native under autograd: values and d hidden, d lm_head close (float32 tight; bfloat16 at its
    resolution, the gradients rounded to bf16 either way), a masked token's -inf kept, no NaN."""
    h, w, ids = make(21, dtype, seed=4)
    ids[3] = int(torch.argmin(logprob.native_logits(h[3:4], w)))  # removed by top-k / top-p
    g = torch.linspace(-1.0, 1.0, 21)
    g[3] = 0.0  # a removed token's -inf is masked out of the loss, as the trainer does
    want, want_gh, want_gw = _unchunked_native_with_grads(h, w, ids, params, g)
    hh, ww = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    got = logprob.native_chunked(hh, ww, ids, SMALL, params, chunk=8)
    got.backward(g)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and bool(torch.isinf(want).any()) == (params is not None)
    fin = torch.isfinite(want)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[fin], want[fin], **tol)
    assert torch.isfinite(hh.grad).all() and torch.isfinite(ww.grad).all()
    torch.testing.assert_close(hh.grad.float(), want_gh.float(), **tol)
    torch.testing.assert_close(ww.grad.float(), want_gw.float(), **tol)


def test_native_dispatch_small_one_call_large_chunked(monkeypatch):
    """Up to NATIVE_ROW_CHUNK rows `native` is the one-call path (its bits unchanged, what the CPU tests
    pin); above it the chunked path: close, and never a [rows x vocab] tensor."""
    h, w, ids = make(33, seed=5)
    one_call = logprob.native_from_logits(logprob.native_logits(h, w), ids, SMALL)
    assert_bitwise_equal(logprob.native(h, w, ids, SMALL), one_call, "33 rows: the one-call native path")
    calls = []
    real = logprob.native_logits
    monkeypatch.setattr(logprob, "native_logits", lambda hid, wt: calls.append(hid.shape[0]) or real(hid, wt))
    monkeypatch.setattr(logprob, "NATIVE_ROW_CHUNK", 16)
    chunked = logprob.native(h, w, ids, SMALL)
    assert calls == [16, 16, 1], calls
    torch.testing.assert_close(chunked, one_call, rtol=1e-4, atol=1e-4)
    with pytest.raises(OpInputError, match="chunk must be a positive row count"):
        logprob.native_chunked(h, w, ids, SMALL, chunk=0)


def test_bad_inputs():
    h, w, ids = make(4)
    with pytest.raises(OpInputError, match=r"rlkit.ops.logprob: token_ids has shape \(3,\); expected \[4\]"):
        logprob.reference(h, w, ids[:3], SMALL)
    with pytest.raises(OpInputError, match=r"token ids must lie in \[0, 4321\)"):
        logprob.reference(h, w, torch.tensor([0, 1, 2, V]), SMALL)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)


@pytest.mark.parametrize("path", ["strict", "native"])
def test_ids_in_range_skips_only_the_range_check(path):
    """`ids_in_range` (the engine's sampled ids): the same bits as the checked call; the shape check still
    runs, and only the range check (a device read) is the caller's to vouch for."""
    from rlkit import ops

    contract = SMALL if path == "strict" else NumericsContract.native()
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(9))
    ids = torch.tensor([0, 7, V - 1, 3, 99])
    with ops.use_contract(contract):
        for params in (None, SamplingParams(temperature=0.7, top_p=0.9)):
            assert_bitwise_equal(ops.logprob_from_logits(logits, ids, params, ids_in_range=True),
                                 ops.logprob_from_logits(logits, ids, params), f"{path} {params}")
        with pytest.raises(OpInputError, match=r"token ids must lie in"):
            ops.logprob_from_logits(logits, torch.tensor([0, 1, 2, 3, V]))
        with pytest.raises(OpInputError, match=r"token_ids has shape"):
            ops.logprob_from_logits(logits, ids[:3], ids_in_range=True)


def test_strict_and_native_share_the_chunked_backward():
    """Both paths' autograd run `logprob.chunked_backward` at NATIVE_ROW_CHUNK rows a chunk: from the same
    upstream gradient the strict logprob's d hidden and d lm_head are the native chunked logprob's, bit
    for bit (a training step's strict/native price is then the forwards')."""
    h, w, ids = make(37, seed=6)
    g = torch.linspace(-1.0, 1.0, 37)
    grads = []
    for fn in (lambda hh, ww: logprob.strict(hh, ww, ids, SMALL),
               lambda hh, ww: logprob.native_chunked(hh, ww, ids, SMALL, chunk=logprob.NATIVE_ROW_CHUNK)):
        hh, ww = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
        fn(hh, ww).backward(g)
        grads.append((hh.grad, ww.grad))
    assert_bitwise_equal(grads[0][0], grads[1][0], "d hidden: strict vs native chunked")
    assert_bitwise_equal(grads[0][1], grads[1][1], "d lm_head: strict vs native chunked")
