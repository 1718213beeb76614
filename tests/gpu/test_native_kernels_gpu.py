"""The native control's fused CUDA kernels (kernels/rms_norm.py, rope.py, swiglu.py) and its chunked
logprob (kernels/logprob.py) on the GPU.

What a user would really run as the control strict is measured against: each fused kernel is close to
HF's eager op (bf16 tolerances: the native bits answer to nothing, so nothing here is bitwise except
"`native()` ran this kernel"), `native()` picks it for CUDA tensors without autograd and the eager op
under autograd, a CUDA graph captures all three (a replay on new inputs equals eager), and the chunked
logprob at the trainer-heavy shape (qwen3-1.7b, 16 x 2k-token responses: 32k rows x 151,936 vocab) fits
in one chunk's logits where the one-call path needs 20 GB of fp32 logits.
"""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal
from rlkit.kernels import logprob, rms_norm, rope, swiglu
from tests.gpu.test_kernels_gpu import randn, rel

pytestmark = pytest.mark.gpu
DEV = "cuda"
C = NumericsContract.native()



@pytest.mark.parametrize("h", [128, 1024, 2048])
def test_native_rms_norm_fused_close_and_dispatched(h):
    x, r = randn(3000, h, seed=1), randn(3000, h, seed=2)
    w = (1 + 0.1 * randn(h, dtype=torch.float32, seed=3)).bfloat16()
    y, s = rms_norm.triton_native_rms_norm(x, w, 1e-6, r)
    ey, es = rms_norm.native_eager(x, w, 1e-6, r)
    assert_bitwise_equal(s, es, "residual sum: one bf16 add either way")
    assert rel(y, ey) < 1e-2
    with torch.no_grad():
        ny, ns = rms_norm.native(x, w, 1e-6, r)
    assert_bitwise_equal(ny, y, "native() runs the fused kernel on CUDA")
    q = randn(64, 16, 128, seed=4)  # q_norm's [tokens, heads, head_dim]
    wq = (1 + 0.1 * randn(128, dtype=torch.float32, seed=5)).bfloat16()
    assert rel(rms_norm.native(q, wq, 1e-6), rms_norm.native_eager(q, wq, 1e-6)) < 1e-2
    xg = x[:8].clone().requires_grad_(True)
    assert_bitwise_equal(rms_norm.native(xg, w, 1e-6).detach(), rms_norm.triton_native_rms_norm(x[:8], w, 1e-6),
                         "under autograd: the fused kernel too (with the fused backward)")


def test_native_swiglu_fused_close_and_dispatched():
    g, u = randn(1000, 3072, scale=3.0, seed=6), randn(1000, 3072, seed=7)
    y = swiglu.triton_native_swiglu(g, u)
    assert rel(y, swiglu.native_eager(g, u)) < 1e-2
    assert_bitwise_equal(swiglu.native(g, u), y, "native() runs the fused kernel on CUDA")
    gg = g[:4].clone().requires_grad_(True)
    assert_bitwise_equal(swiglu.native(gg, u[:4]).detach(), swiglu.triton_native_swiglu(g[:4], u[:4]),
                         "under autograd: the fused kernel too (with the fused backward)")


def test_native_rope_fused_close_cached_and_dispatched():
    x = randn(500, 16, 128, seed=8)
    pos = torch.randint(0, 40_000, (500,), device=DEV)
    y = rope.triton_native_rope(x, pos, 1e6)
    assert rel(y, rope.native_eager(x, pos, 1e6)) < 1e-2
    assert_bitwise_equal(rope.triton_native_rope(x, pos, 1e6, max_position=40_960), y, "a bound vs read positions")
    assert_bitwise_equal(rope.native(x, pos, 1e6, max_position=40_960), y, "native() runs the fused kernel on CUDA")
    before = rope.native_tables.cache_info().misses
    rope.native(x, pos, 1e6, max_position=40_960)
    assert rope.native_tables.cache_info().misses == before, "the cos/sin table is built once, then read"
    xg = x[:3].clone().requires_grad_(True)
    assert_bitwise_equal(rope.native(xg, pos[:3], 1e6).detach(), rope.triton_native_rope(x[:3], pos[:3], 1e6),
                         "under autograd: the fused kernel too (with the fused backward)")


@torch.no_grad()
def test_a_cuda_graph_captures_the_fused_native_kernels():
    """RMSNorm + residual, q_norm-shaped RMSNorm, RoPE (bounded positions) and silu * up captured in one
    graph; a replay after new inputs are copied in equals the eager kernels on those inputs."""
    h, heads, d, inter = 1024, 16, 128, 3072
    x, r = randn(64, h, seed=10), randn(64, h, seed=11)
    w, wq = randn(h, seed=12), randn(d, seed=13)
    q = randn(64, heads, d, seed=14)
    pos = torch.randint(0, 512, (64,), device=DEV)
    g, u = randn(64, inter, seed=15), randn(64, inter, seed=16)

    def step():
        y, s = rms_norm.native(x, w, 1e-6, r)
        qq = rope.native(rms_norm.native(q, wq, 1e-6), pos, 1e6, max_position=512)
        return y, s, qq, swiglu.native(g, u)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles the kernels and builds the table before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for buf, seed in ((x, 20), (r, 21), (q, 22), (g, 23), (u, 24)):
        buf.copy_(randn(*buf.shape, seed=seed))
    pos.copy_(torch.randint(0, 512, (64,), device=DEV))
    graph.replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("rms_norm", "residual", "q_norm+rope", "swiglu"), outs, step()):
        assert_bitwise_equal(got, want, f"{name}: graph replay vs eager on the new inputs")


def test_native_chunked_logprob_close_on_the_gpu():
    """5,000 rows (two chunks) at the Qwen3 vocab: values and gradients close to the one-call native."""
    h = randn(5000, 1024, seed=30).requires_grad_(True)
    w = randn(151_936, 1024, scale=0.05, seed=31).requires_grad_(True)
    ids = torch.randint(0, 151_936, (5000,), device=DEV)
    gout = torch.rand(5000, device=DEV)
    got = logprob.native(h, w, ids, C)
    gh, gw = torch.autograd.grad(got, (h, w), gout)
    want = logprob.native_from_logits(logprob.native_logits(h, w), ids, C)
    wh, ww = torch.autograd.grad(want, (h, w), gout)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert rel(gh, wh) < 2e-2 and rel(gw, ww) < 2e-2, (rel(gh, wh), rel(gw, ww))


def test_native_logprob_at_the_trainer_heavy_shape_holds_one_chunk():
    """qwen3-1.7b's lm_head, 32,768 rows: forward + backward peak memory beyond the inputs stays under
    12 GB (one 4,096-row chunk's fp32 logits are 2.5 GB), where the one-call path's logits alone are 20 GB."""
    rows, hid, vocab = 32_768, 2048, 151_936
    h = randn(rows, hid, seed=32).requires_grad_(True)
    w = randn(vocab, hid, scale=0.05, seed=33).requires_grad_(True)
    ids = torch.randint(0, vocab, (rows,), device=DEV)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = logprob.native(h, w, ids, C)
    out.sum().backward()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / 2**30
    print(f"native logprob {rows} x {vocab}: forward + backward peak {extra:.1f} GiB beyond the inputs")
    assert torch.isfinite(out).all() and torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
    assert extra < 12, f"{extra:.1f} GiB"


def test_the_engine_decode_graph_captures_the_fused_native_kernels(monkeypatch):
    """The embedded engine under the native contract with CUDA graphs (qwen3-0.6b shape): every fused
    native launcher is launched inside a decode graph's capture, graphs were captured and replayed, and
    the logprobs are finite. The native bits answer to nothing, so graph vs
    eager decode is not compared here (tests/gpu/test_decode_graphs.py prints it)."""
    from tests.gpu.test_decode_graphs import generate, requests
    from tests.gpu.test_parity_gpu import gpu_model

    calls = {"rms_norm": 0, "rope": 0, "swiglu": 0}

    def counting(name, module, attr):
        real = getattr(module, attr)

        def wrapped(*args, **kwargs):
            calls[name] += torch.cuda.is_current_stream_capturing()  # launched inside a graph capture
            return real(*args, **kwargs)
        monkeypatch.setattr(module, attr, wrapped)

    counting("rms_norm", rms_norm, "triton_native_rms_norm")
    counting("rope", rope, "triton_native_rope")
    counting("swiglu", swiglu, "triton_native_swiglu")
    engine, results = generate(gpu_model("qwen3-0.6b"), NumericsContract.native(), True, requests(6))
    assert engine.graphs.captures >= 1 and engine.graphs.steps >= 10, (engine.graphs.captures, engine.graphs.steps)
    assert all(n > 0 for n in calls.values()), calls
    for r in results:
        assert r.token_ids and all(torch.isfinite(torch.tensor(r.raw_logprobs))), r.request_id


def _per_sequence_fp32(q, k, v, lens):
    """Causal GQA attention per sequence in fp32 (SDPA on [1, H, n, d]): the truth for the native forms."""
    outs, at, group = [], 0, q.shape[1] // k.shape[1]
    for n in lens:
        qi, ki, vi = (t[at : at + n].float().transpose(0, 1)[None] for t in (q, k, v))
        ki, vi = ki.repeat_interleave(group, 1), vi.repeat_interleave(group, 1)
        outs.append(torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True)[0].transpose(0, 1))
        at += n
    return torch.cat(outs)


def test_native_packed_prefill_is_one_varlen_flash_call_close_forward_and_backward():
    """The trainer's native attention: a packed causal prefill runs as one varlen flash call (causal,
    sequences kept apart, GQA), close to per-sequence fp32 attention in value and in gradient."""
    from rlkit.types import AttentionLayout
    from rlkit.kernels import attention, attention_native

    lens = [5, 300, 129, 1024]
    t, heads, kv_heads, d = sum(lens), 16, 8, 128
    q, k, v = randn(t, heads, d, seed=11), randn(t, kv_heads, d, seed=12), randn(t, kv_heads, d, seed=13)
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], device=DEV)
    layout = AttentionLayout.prefill(cu)
    assert attention.varlen_prefill_ok(q, layout, attention.host_bounds(layout)), (
        f"this torch ({torch.__version__}) has no varlen flash attention: the native prefill loops instead")
    out = attention.native(q, k, v, layout)
    assert attention_native._VARLEN is not None, "varlen flash refused the call (see the warning)"
    want = _per_sequence_fp32(q, k, v, lens)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel(out, want) < 1e-2, rel(out, want)
    leaves = [t_.clone().requires_grad_(True) for t_ in (q, k, v)]
    ref_leaves = [t_.float().clone().requires_grad_(True) for t_ in (q, k, v)]
    g = randn(t, heads, d, seed=14)
    attention.native(*leaves, layout).backward(g)
    _per_sequence_fp32(*ref_leaves, lens).backward(g.float())
    for name, a, b in zip("qkv", leaves, ref_leaves):
        assert rel(a.grad, b.grad) < 2e-2, (name, rel(a.grad, b.grad))


def test_native_paged_prefill_is_one_varlen_flash_call_close_to_the_masked_loop(monkeypatch):
    """The engine's native prefill against the paged cache: chunks starting at position 0 and past it, and
    a decode row, in one forward, run as one varlen flash call over the keys gathered from the pages
    (bottom-right causal), close to the per-sequence masked SDPA in fp32."""
    from rlkit.kernels import attention, attention_native
    from rlkit.types import AttentionLayout
    from tests.gpu.test_kernels_gpu import Paged, qkv

    cache = Paged()
    seqs = {sid: qkv(n, seed) for sid, n, seed in (("a", 700, 80), ("b", 1300, 81), ("c", 90, 82), ("d", 33, 83))}
    for sid, (_, k, v) in seqs.items():
        cache.write(sid, 0, k, v)
    # a: whole prompt from 0; b: its last 300 tokens (a chunk from 1000); c: one decode row; d: from 0
    chunks = [("a", 0, 700), ("b", 1000, 1300), ("c", 89, 90), ("d", 0, 33)]
    q = torch.cat([seqs[sid][0][lo:hi] for sid, lo, hi in chunks])
    width = max(len(cache.tables[sid]) for sid, *_ in chunks)
    bt = torch.tensor([cache.tables[sid] + [0] * (width - len(cache.tables[sid])) for sid, *_ in chunks], device=DEV)
    layout = AttentionLayout.paged(torch.tensor([hi - lo for _, lo, hi in chunks], device=DEV),
                                   torch.tensor([hi for *_, hi in chunks], device=DEV), bt)
    assert attention.varlen_prefill_ok(q, layout, attention.host_bounds(layout))
    calls = []
    varlen, causal, takes_gqa = attention_native._VARLEN

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return varlen(*args, **kwargs)

    monkeypatch.setattr(attention_native, "_VARLEN", (counted, causal, takes_gqa))
    out = attention.native(q, cache.k, cache.v, layout)
    assert calls == [q.shape[0]], f"expected one varlen call over {q.shape[0]} queries, got {calls}"
    monkeypatch.setattr(attention_native, "_VARLEN", None)  # the per-sequence masked loop, in fp32
    want = attention.native(q.float(), cache.k.float(), cache.v.float(), layout)
    assert out.shape == q.shape and out.dtype == q.dtype
    at = 0
    for sid, lo, hi in chunks:
        part = rel(out[at : at + hi - lo], want[at : at + hi - lo])
        assert part < 1e-2, (sid, lo, hi, part)
        at += hi - lo


@pytest.mark.parametrize("h", [128, 2048])
def test_one_fused_backward_for_both_paths_close_to_autograd(h):
    """RMSNorm (+ residual, a gradient reaching the sum too) and SwiGLU: the strict and the native
    forward under autograd hand the same upstream gradient to the same fused backward, so their input
    gradients are the same bits; and they are close to autograd over HF's eager ops."""
    x, r, gy, gs = (randn(3000, h, seed=s_) for s_ in (21, 22, 23, 24))
    w = (1 + 0.1 * randn(h, dtype=torch.float32, seed=25)).bfloat16()

    def grads(fn):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, r)]
        y, s_ = fn(*leaves)
        torch.autograd.backward([y, s_], [gy, gs])
        return [t.grad for t in leaves]

    strict = grads(lambda a, b, c: rms_norm.strict(a, b, 1e-6, NumericsContract.default(), c))
    native = grads(lambda a, b, c: rms_norm.native(a, b, 1e-6, c))
    eager = grads(lambda a, b, c: rms_norm.native_eager(a, b, 1e-6, c))
    for name, a, b, e in zip(("x", "weight", "residual"), strict, native, eager):
        assert_bitwise_equal(a, b, f"RMSNorm d{name}: strict and native share the backward")
        assert rel(a, e) < 2e-2, (name, rel(a, e))
    g, u, d = randn(1000, 3 * h, scale=3.0, seed=26), randn(1000, 3 * h, seed=27), randn(1000, 3 * h, seed=28)

    def swiglu_grads(fn):
        leaves = [t.clone().requires_grad_(True) for t in (g, u)]
        fn(*leaves).backward(d)
        return [t.grad for t in leaves]

    strict = swiglu_grads(lambda a, b: swiglu.strict(a, b, NumericsContract.default()))
    native = swiglu_grads(swiglu.native)
    eager = swiglu_grads(swiglu.native_eager)
    for name, a, b, e in zip(("gate", "up"), strict, native, eager):
        assert_bitwise_equal(a, b, f"SwiGLU d{name}: strict and native share the backward")
        assert rel(a, e) < 2e-2, (name, rel(a, e))


def test_rope_backward_shared_by_both_paths_close_to_autograd():
    x, gy = randn(500, 16, 128, seed=31), randn(500, 16, 128, seed=32)
    pos = torch.randint(0, 40_000, (500,), device=DEV)

    def grad(fn):
        leaf = x.clone().requires_grad_(True)
        fn(leaf).backward(gy)
        return leaf.grad

    strict = grad(lambda a: rope.strict(a, pos, 1e6, NumericsContract.default()))
    native = grad(lambda a: rope.native(a, pos, 1e6))
    eager = grad(lambda a: rope.native_eager(a, pos, 1e6))
    assert_bitwise_equal(strict, native, "RoPE: strict and native share the backward")
    assert rel(strict, eager) < 2e-2, rel(strict, eager)


def test_strict_attention_backward_from_its_own_log_sum_exp_close_to_fp32():
    """A trainer's packed prefill under autograd: the strict forward also leaves each row's log-sum-exp
    (close to flash's own), its output the same bits as without, and flash's varlen backward runs from
    them (no native forward recomputed): gradients close to per-sequence fp32 attention's."""
    from rlkit.kernels import attention, attention_native
    from rlkit.types import AttentionLayout

    lens = [5, 300, 129, 1024]
    t, heads, kv_heads, d = sum(lens), 16, 8, 128
    q, k, v = randn(t, heads, d, seed=21), randn(t, kv_heads, d, seed=22), randn(t, kv_heads, d, seed=23)
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], device=DEV)
    layout = AttentionLayout.prefill(cu)
    contract = NumericsContract.default()
    buffers = attention_native.flash_stats_buffer(q, k, layout)
    assert buffers is not None, f"torch {torch.__version__}: flash's varlen ops refused the log-sum-exp probe"
    out, written = attention.triton_attention(q, k, v, layout, contract, lse=buffers[1])
    assert written
    assert_bitwise_equal(out, attention.triton_attention(q, k, v, layout, contract), "output with the lse stored")
    cu32 = cu.to(torch.int32)
    flash_lse = torch.ops.aten._flash_attention_forward(q, k, v, cu32, cu32, max(lens), max(lens), 0.0, True, False,
                                                        scale=d ** -0.5)[1]
    assert float((buffers[0] - flash_lse).abs().max()) < 1e-2
    leaves = [t_.clone().requires_grad_(True) for t_ in (q, k, v)]
    ref_leaves = [t_.float().clone().requires_grad_(True) for t_ in (q, k, v)]
    g = randn(t, heads, d, seed=24)
    recomputed = []
    real = attention.native_forward
    attention.native_forward = lambda *a: recomputed.append(1) or real(*a)
    try:
        attention.strict(*leaves, layout, contract).backward(g)
    finally:
        attention.native_forward = real
    assert not recomputed, "the backward recomputed native's forward"
    _per_sequence_fp32(*ref_leaves, lens).backward(g.float())
    for name, a, b in zip("qkv", leaves, ref_leaves):
        assert rel(a.grad, b.grad) < 2e-2, (name, rel(a.grad, b.grad))


def test_logprob_weight_gradient_accumulates_in_cublas_fp32_epilogue():
    """logprob.accumulate_fp32 on CUDA: this torch's fp32-out addmm into its own input (the fast form the
    shared logprob backward takes), close to the fp32 product added."""
    from rlkit.kernels import logprob

    assert logprob._fp32_out_addmm(torch.device(DEV)), f"torch {torch.__version__}: no fp32-out addmm here"
    a, b = randn(1024, 4101, seed=25), randn(4101, 3072, seed=26)
    acc = randn(1024, 3072, dtype=torch.float32, seed=27)
    want = acc + torch.mm(a, b, out_dtype=torch.float32)
    logprob.accumulate_fp32(acc, a, b)
    assert rel(acc, want) < 1e-5, rel(acc, want)


def _attention_grads(fn, q, k, v, g, layout):
    leaves = [t_.clone().requires_grad_(True) for t_ in (q, k, v)]
    fn(*leaves, layout).backward(g)
    return [t_.grad for t_ in leaves]


@pytest.mark.parametrize("path", ["strict", "native"])
def test_attention_backward_repeats_bit_for_bit(path):
    """A resumed run replays its steps and must find the stored weights (rlkit/rundir.py): the attention
    backward, both paths, gives the same bits every time at a trainer's shape (16 sequences of 1-2k tokens,
    GQA 16/8, many key blocks a query block: the case whose atomic dQ sums repeat least). Printed beside it:
    whether torch's own backward (`native_forward` under autograd, no deterministic scope) repeated in the
    same number of tries, the reason the scope exists (kernels/determinism.py)."""
    from rlkit.types import AttentionLayout
    from rlkit.kernels import attention

    lens = [1024 + 61 * i for i in range(16)]
    t, heads, kv_heads, d = sum(lens), 16, 8, 128
    q, k, v, g = (randn(t, n, d, seed=30 + i) for i, n in enumerate((heads, kv_heads, kv_heads, heads)))
    layout = AttentionLayout.prefill(torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], device=DEV))
    contract = NumericsContract.default()
    fn = ((lambda q_, k_, v_, lay: attention.strict(q_, k_, v_, lay, contract)) if path == "strict"
          else attention.native)
    first = _attention_grads(fn, q, k, v, g, layout)
    plain_first = _attention_grads(attention.native_forward, q, k, v, g, layout)
    plain_repeats = True
    for _ in range(4):
        again = _attention_grads(fn, q, k, v, g, layout)
        for name, a, b in zip("qkv", again, first):
            assert_bitwise_equal(a, b, f"{path} attention's d{name}, a repeat of the same backward")
        plain = _attention_grads(attention.native_forward, q, k, v, g, layout)
        plain_repeats &= all(torch.equal(a, b) for a, b in zip(plain, plain_first))
    assert not torch.are_deterministic_algorithms_enabled(), "the scope must restore the caller's setting"
    print(f"torch's backward without the deterministic scope repeated in 4 tries: {plain_repeats}")
