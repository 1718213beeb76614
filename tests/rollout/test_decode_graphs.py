"""The padded static-buffer decode step that CUDA graphs capture (rlkit/rollout/decode_graphs.py), run
eagerly on the CPU (capture=False): padding rows to the bucket and reading the batch from static
buffers change no bit of any request, and the padding touches no page a sequence owns. The capture
itself runs in tests/gpu/test_decode_graphs.py."""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal
from rlkit.model import build_model, preset
from rlkit.rollout import EmbeddedEngine, EngineConfig, GenerationRequest, SamplingParams
from rlkit.rollout.decode_graphs import DecodeGraphs, buckets_up_to


@pytest.fixture(scope="module")
def model():
    return build_model(preset("tiny"), seed=5)


def requests(n, max_tokens=9):
    g = torch.Generator().manual_seed(3)
    return [GenerationRequest(f"r{i}", tuple(torch.randint(0, 151_000, (4 + 7 * i,), generator=g).tolist()),
                              SamplingParams(max_tokens=max_tokens + i, seed=1, stop_token_ids=(),
                                             temperature=0.8 if i % 2 else 1.0))
            for i in range(n)]


def engine(model, contract, static: bool):
    cfg = EngineConfig(page_size=8, num_pages=64, max_num_seqs=6, max_batch_tokens=64, max_model_len=96)
    eng = EmbeddedEngine(model, contract, cfg)
    if static:
        eng.graphs = DecodeGraphs(model, eng.cache, cfg.max_num_seqs, cfg.max_model_len, capture=False)
    return eng


def test_buckets():
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(6) == [1, 2, 4, 6]
    assert buckets_up_to(64) == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_padded_static_decode_equals_eager_decode(model, dtype):
    m = model if dtype == "bfloat16" else build_model(preset("tiny").with_dtype(dtype), seed=5)
    contract = NumericsContract.default()
    reqs = requests(5)  # 5 rows pad to the bucket of 6; rows finish at different steps: 4, 2, 1 ...
    eager = engine(m, contract, static=False).generate(reqs)
    static_engine = engine(m, contract, static=True)
    static = static_engine.generate(reqs)
    assert static_engine.graphs.steps >= 8, "the decode steps went through the static path"
    for a, b in zip(eager, static):
        assert a.token_ids == b.token_ids, a.request_id
        assert_bitwise_equal(torch.tensor(b.raw_logprobs), torch.tensor(a.raw_logprobs), f"{a.request_id} raw")
        assert_bitwise_equal(torch.tensor(b.processed_logprobs), torch.tensor(a.processed_logprobs),
                             f"{a.request_id} processed")


def test_padding_writes_only_the_scratch_page(model):
    contract = NumericsContract.default()
    eng = engine(model, contract, static=True)
    for r in requests(3, max_tokens=2):
        eng.add_request(r)
    eng.step()  # prefill (eager): every sequence's prompt is in the cache
    owned = sorted(p for s in eng._running for p in s.pages)
    before = [k.clone() for k in eng.cache.k]
    eng.step()  # a decode step of 3 rows, padded to the bucket of 4
    scratch = eng.cache.scratch_page
    assert scratch not in owned
    for layer, (k0, k1) in enumerate(zip(before, eng.cache.k)):
        changed = sorted(set(torch.nonzero((k0 != k1).flatten(1).any(1)).flatten().tolist()))
        assert set(changed) <= set(owned) | {scratch}, f"layer {layer}: pages {changed} changed"
        assert scratch in changed, "the padding row's K went to the scratch page"


def test_more_rows_than_buckets_is_a_clear_error(model):
    eng = engine(model, NumericsContract.default(), static=True)
    with pytest.raises(ValueError, match="exceed max_num_seqs"):
        eng.graphs.bucket(7)


def test_the_step_ahead_runs_while_the_batch_holds_and_reads_nothing_of_finished_rows(model):
    """One step ahead: with every request admitted and none finishing, each step() launches the next
    decode before reading its own; a step ahead whose rows all finished is dropped, so nothing is left in
    flight once generate returns, and a contract switch reads the step ahead first."""
    contract = NumericsContract.default()
    eng = engine(model, contract, static=True)
    reqs = requests(4, max_tokens=6)
    for r in reqs:
        eng.add_request(r)
    eng.step()  # prefill, eager
    assert eng._ahead is None
    eng.step()  # a decode step from the buffers' fill, and the next launched ahead
    assert eng._ahead is not None and [s.request.request_id for s in eng._ahead.seqs] == [r.request_id for r in reqs]
    replays = eng.graphs.steps
    eng.set_contract(contract)  # drains: the step ahead is read, none launched
    assert eng._ahead is None and eng.graphs.steps == replays
    results = {r.request_id: r for r in eng.run_until_done()}
    assert eng._ahead is None and not eng.has_unfinished()
    alone = engine(model, contract, static=False)
    for r in reqs:
        want = alone.generate([r])[0]
        got = results[r.request_id]
        assert got.token_ids == want.token_ids and len(got.token_ids) == r.sampling.max_tokens, r.request_id
        assert_bitwise_equal(torch.tensor(got.raw_logprobs), torch.tensor(want.raw_logprobs), r.request_id)
