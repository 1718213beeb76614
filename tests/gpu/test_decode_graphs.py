"""CUDA-graph decode in the embedded engine (rlkit/rollout/decode_graphs.py) at the qwen3-0.6b shape:
tokens and logprobs replayed from graphs equal eager decode bit for bit (strict), with requests joining
and finishing so the batch moves between buckets, and a contract switch captures a new graph."""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import compare
from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.rollout.types import GenerationRequest
from rlkit.types import SamplingParams
from tests.gpu.test_parity_gpu import gpu_model

pytestmark = pytest.mark.gpu


def requests(n: int):
    g = torch.Generator().manual_seed(9)
    return [GenerationRequest(f"g{i}", tuple(torch.randint(0, 151_000, (8 + 37 * i % 300,), generator=g).tolist()),
                              SamplingParams(max_tokens=24 + 5 * i, seed=3, stop_token_ids=(),
                                             temperature=0.7 if i % 3 == 0 else 1.0, top_p=0.9 if i % 3 == 0 else 1.0))
            for i in range(n)]


def generate(model, contract, graphs: bool, reqs):
    cfg = EngineConfig(page_size=16, num_pages=1024, max_num_seqs=24, max_batch_tokens=1024, max_model_len=512,
                       cuda_graphs=graphs)
    engine = EmbeddedEngine(model, contract, cfg)
    return engine, engine.generate(reqs)


def test_graph_decode_equals_eager_decode_strict():
    model = gpu_model("qwen3-0.6b")
    contract = NumericsContract.default()
    reqs = requests(20)
    _, eager = generate(model, contract, False, reqs)
    engine, graphed = generate(model, contract, True, reqs)
    assert engine.graphs.captures >= 2 and engine.graphs.steps >= 50, (engine.graphs.captures, engine.graphs.steps)
    tokens = sum(len(r.token_ids) for r in eager)
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids, a.request_id
        for kind in ("raw_logprobs", "processed_logprobs"):
            rep = compare(torch.tensor(getattr(b, kind)), torch.tensor(getattr(a, kind)))
            assert rep.equal, f"{a.request_id} {kind}: {rep}"
    print(f"qwen3-0.6b graph vs eager decode (strict): {tokens} tokens, 0 differ; "
          f"{engine.graphs.captures} captures, {engine.graphs.steps} replays")


def test_graph_decode_native_and_contract_switch():
    model = gpu_model("qwen3-0.6b")
    reqs = requests(6)
    _, eager = generate(model, NumericsContract.native(), False, reqs)
    engine, graphed = generate(model, NumericsContract.native(), True, reqs)
    differ = sum(a.token_ids != b.token_ids for a, b in zip(eager, graphed))
    print(f"qwen3-0.6b graph vs eager decode (native): {differ}/{len(reqs)} requests differ in tokens "
          f"(the padded row count changes cuBLAS's choice)")
    captures = engine.graphs.captures
    engine.set_contract(NumericsContract.default())
    strict = engine.generate(reqs)
    assert engine.graphs.captures > captures, "a new contract captures new graphs"
    _, strict_eager = generate(model, NumericsContract.default(), False, reqs)
    for a, b in zip(strict_eager, strict):
        assert a.token_ids == b.token_ids and compare(torch.tensor(b.raw_logprobs), torch.tensor(a.raw_logprobs)).equal


def test_release_when_idle_frees_the_cache_and_graphs_and_moves_no_bit():
    """An engine that releases its KV cache and decode graphs when a call returns (`release_when_idle`, so
    a colocated trainer gets the memory) hands the GPU memory back and decodes the next call, from newly
    captured graphs, to the bits of an engine that keeps them."""
    model = gpu_model("qwen3-0.6b")
    contract = NumericsContract.default()
    shape = dict(page_size=16, num_pages=1024, max_num_seqs=24, max_batch_tokens=1024, max_model_len=512)
    keeping = EmbeddedEngine(model, contract, EngineConfig(**shape))
    releasing = EmbeddedEngine(model, contract, EngineConfig(**shape, release_when_idle=True))
    kv_bytes = sum(t.numel() * t.element_size() for t in keeping.cache.k + keeping.cache.v)
    for call in range(2):
        reqs = requests(8 + 4 * call)
        kept = keeping.generate(reqs)
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        got = releasing.generate(reqs)
        torch.cuda.synchronize()
        after = torch.cuda.memory_reserved()
        assert not releasing.allocated and releasing.graphs is None
        assert after <= before + 1, f"call {call}: {after - before} bytes more reserved after the call returned"
        for a, b in zip(kept, got):
            assert a.token_ids == b.token_ids, f"call {call} {a.request_id}"
            rep = compare(torch.tensor(b.raw_logprobs), torch.tensor(a.raw_logprobs))
            assert rep.equal, f"call {call} {a.request_id}: {rep}"
    releasing._allocate()
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated()
    releasing.release()
    dropped = grown - torch.cuda.memory_allocated()
    assert dropped >= kv_bytes, f"release freed {dropped} bytes, the KV cache is {kv_bytes}"
    print(f"release_when_idle: 2 calls equal to a keeping engine; release frees {dropped / 2**20:.0f} MiB "
          f"(KV {kv_bytes / 2**20:.0f} MiB)")
