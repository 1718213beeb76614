"""rlkit.ops: one dispatch point per op, following a scoped contract (no global state in torch)."""

import threading

import pytest
import torch

from rlkit import NumericsContract, ops
from rlkit.bitwise import assert_bitwise_equal
from rlkit.contract import GemmSpec, LogprobSpec
from rlkit.kernels import gemm, logprob, rms_norm
from rlkit.types import SamplingParams


def test_use_contract_is_scoped_and_restores_on_error():
    default = ops.current_contract()
    native = NumericsContract.native()
    with ops.use_contract(native):
        assert ops.current_contract() is native
        with ops.use_contract(NumericsContract.default().with_ops(linear="native")) as inner:
            assert ops.current_contract() is inner
        assert ops.current_contract() is native
    assert ops.current_contract() is default
    with pytest.raises(RuntimeError):
        with ops.use_contract(native):
            raise RuntimeError("boom")
    assert ops.current_contract() is default
    with pytest.raises(TypeError, match="NumericsContract"):
        with ops.use_contract("strict"):
            pass


def test_contract_is_per_thread():
    seen = {}

    def worker():
        seen["worker"] = ops.current_contract().path("linear")

    with ops.use_contract(NumericsContract.native()):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        seen["main"] = ops.current_contract().path("linear")
    assert seen == {"worker": "strict", "main": "native"}


def test_dispatch_follows_each_op_path():
    x = torch.randn(33, 256)
    w = torch.randn(64, 256)
    nw = torch.randn(256)
    with ops.use_contract(NumericsContract.default().with_ops(linear="native")):
        assert_bitwise_equal(ops.linear(x, w), gemm.native(x, w), "native linear")
        assert_bitwise_equal(ops.rms_norm(x, nw, 1e-6), rms_norm.reference(x, nw, 1e-6, NumericsContract.default()),
                             "strict rms_norm")
    assert_bitwise_equal(ops.linear(x, w), gemm.reference(x, w, NumericsContract.default()), "strict linear")


def test_bad_input_names_the_op():
    with pytest.raises(ops.OpInputError, match=r"^rlkit.ops.linear: "):
        ops.linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(ops.OpInputError, match=r"^rlkit.ops.rms_norm: x has dtype torch.int64"):
        ops.rms_norm(torch.ones(2, 8, dtype=torch.int64), torch.ones(8), 1e-6)


# -- the entries the adapters use (vLLM sampler, Megatron trainer, the engines' sampling) ---------------
def test_log_softmax_follows_the_logprob_path():
    """The vLLM sampler's compute_logprobs: strict is logits - the contract's vocab-chunked LSE, so each
    entry equals `logprob_from_logits` of that token bit for bit; native is torch.log_softmax."""
    small = NumericsContract.default().replace(logprob=LogprobSpec(vocab_chunk=64))
    z = torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 4
    z[1, 7] = float("-inf")
    with ops.use_contract(small):
        full = ops.log_softmax(z)
        for t in (0, 7, 299):
            ids = torch.full((5,), t)
            assert_bitwise_equal(full[:, t], ops.logprob_from_logits(z, ids), f"token {t}")
        assert_bitwise_equal(full, logprob.log_softmax(z, small), "strict = the kernel's log_softmax")
    with ops.use_contract(small.with_ops(logprob="native")):
        assert_bitwise_equal(ops.log_softmax(z), torch.log_softmax(z, -1), "native")
    with pytest.raises(ops.OpInputError, match="rlkit.ops.logprob"):
        with ops.use_contract(small):
            ops.log_softmax(z.double())


def test_process_logits_reads_the_active_contract():
    """The engines sample from `ops.process_logits`; its top-p scan block comes from the contract in
    effect (the CPU scan is sequential, so any block gives the same bits here), and the rows it keeps
    are the ones processed logprobs renormalize over."""
    z = torch.randn(4, 500, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.8)
    a = ops.process_logits(z, params)
    with ops.use_contract(NumericsContract.default().replace(logprob=LogprobSpec(top_p_scan_block=256))):
        b = ops.process_logits(z, params)
    assert_bitwise_equal(a, b, "scan block on the CPU")
    assert_bitwise_equal(a, logprob.process_logits(z, params, NumericsContract.default()), "the kernel's")
    kept = torch.isfinite(a)
    assert int(kept.sum(-1).max()) <= 40 and bool(kept.any(-1).all())
    ids = torch.argmax(a, -1)
    lp = ops.logprob_from_logits(z, ids, params)
    assert bool(torch.isfinite(lp).all()) and bool((lp <= 0).all())


def test_reduce_sum_follows_the_all_reduce_path():
    """Without a process group (one rank) the sum is the tensor itself, in its dtype, on both paths."""
    t = torch.randn(7, dtype=torch.bfloat16)
    for contract in (NumericsContract.default(), NumericsContract.native()):
        with ops.use_contract(contract):
            out = ops.reduce_sum(t)
        assert out.dtype == torch.bfloat16 and out is not t
        assert_bitwise_equal(out, t, contract.path("all_reduce"))


def test_v1_and_v2_give_the_same_bits():
    """v2 changed the contract's field set, not a kernel parameter: every op gives v1's bits."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(9, 256, generator=g).bfloat16(), torch.randn(300, 256, generator=g).bfloat16()
    ids = torch.randint(0, 300, (9,), generator=g)
    params = SamplingParams(temperature=0.9, top_p=0.9)
    outs = []
    for contract in (NumericsContract.v1(), NumericsContract.named("qwen3-dense-strict-v2")):
        with ops.use_contract(contract):
            outs.append((ops.linear(x, w), ops.rms_norm(x, w[0], 1e-6), ops.logprob(x, w, ids),
                         ops.logprob(x, w, ids, params)))
    for name, a, b in zip(("linear", "rms_norm", "logprob raw", "logprob processed"), *outs):
        assert_bitwise_equal(a, b, name)


def test_v3_changes_only_the_column_parallel_gemms():
    """v3 keeps v2's bits wherever it keeps v2's parameters: row-parallel linear layers and every non-GEMM
    op; a column-parallel linear and the lm_head sum K in one chain (gemm.column_k_chunks = 1)."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 256, generator=g).bfloat16(), torch.randn(300, 256, generator=g).bfloat16()
    v2, v3 = NumericsContract.named("qwen3-dense-strict-v2"), NumericsContract.named("qwen3-dense-strict-v3")
    one_chain = v2.replace(gemm=GemmSpec(k_chunks=1, column_k_chunks=None, chunk_merge="pairwise_tree"))
    outs = {}
    for name, contract in (("v2", v2), ("v3", v3), ("one_chain", one_chain)):
        with ops.use_contract(contract):
            outs[name] = (ops.linear(x, w, row_parallel=True), ops.rms_norm(x, w[0], 1e-6), ops.linear(x, w),
                          ops.logits(x, w))
    assert_bitwise_equal(outs["v3"][0], outs["v2"][0], "row-parallel linear v3 vs v2")
    assert_bitwise_equal(outs["v3"][1], outs["v2"][1], "rms_norm v3 vs v2")
    assert_bitwise_equal(outs["v3"][2], outs["one_chain"][2], "column linear v3 vs one chain")
    assert_bitwise_equal(outs["v3"][3], outs["one_chain"][3], "lm_head logits v3 vs one chain")
    with ops.use_contract(v3), pytest.raises(ops.OpInputError, match="only a row-parallel layer"):
        ops.linear(x, w, tp_size=2)


def test_only_ops_and_the_benchmarks_import_the_kernels():
    """The dispatch point is the one way into rlkit.kernels: the model, engines, trainers and adapters
    name ops (and rlkit.types for the shared value types)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "rlkit"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "ops.py" or rel.startswith("bench/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "rlkit.kernels" or n.startswith("rlkit.kernels.") for n in names):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"import rlkit.kernels outside rlkit/ops.py: {offenders}"
