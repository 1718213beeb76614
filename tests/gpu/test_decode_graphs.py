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
