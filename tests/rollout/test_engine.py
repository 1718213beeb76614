"""The embedded engine: continuous batching and chunked prefill change no bits; a request that cannot fit
gets a clear error while the others finish; weights load in place; the contract switches at a step."""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal
from rlkit.model import build_model, preset
from rlkit.model.checkpoint import weights_checksum
from rlkit.rollout import EmbeddedEngine, EngineConfig, GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def model():
    return build_model(preset("tiny"), seed=11)


def req(rid, n_prompt, max_tokens=12, seed=0, **sampling):
    g = torch.Generator().manual_seed(hash(rid) % 2**31)
    prompt = tuple(torch.randint(0, 151_000, (n_prompt,), generator=g).tolist())
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, seed=seed, stop_token_ids=(),
                                                         **sampling))


def run_alone(model, request, **cfg):
    return EmbeddedEngine(model, config=EngineConfig(**cfg)).generate([request])[0]


def test_requests_joining_and_leaving_change_no_bits(model):
    """Requests arrive while others decode (continuous batching), long prompts are prefilled in chunks of
    the step budget; every request's tokens and logprobs equal those of the same request run alone."""
    engine = EmbeddedEngine(model, config=EngineConfig(max_num_seqs=3, max_batch_tokens=24, page_size=8))
    first = [req("a", 40, 10), req("b", 7, 20)]
    for r in first:
        engine.add_request(r)
    done = {}
    for _ in range(4):
        for res in engine.step():
            done[res.request_id] = res
    late = [req("c", 55, 8, temperature=0.7, top_p=0.9), req("d", 3, 5), req("e", 30, 6)]
    for r in late:  # joins mid-flight; "e" waits for a free sequence slot
        engine.add_request(r)
    for res in engine.run_until_done():
        done[res.request_id] = res
    for r in first + late:
        alone = run_alone(model, r)
        got = done[r.request_id]
        assert got.token_ids == alone.token_ids, r.request_id
        assert_bitwise_equal(torch.tensor(got.raw_logprobs), torch.tensor(alone.raw_logprobs), f"{r.request_id} raw")
        assert_bitwise_equal(torch.tensor(got.processed_logprobs), torch.tensor(alone.processed_logprobs),
                             f"{r.request_id} processed")
        assert got.finish_reason == "length" and got.weight_version == 0
        assert got.contract_fingerprint == NumericsContract.default().fingerprint()


def test_a_request_that_cannot_fit_fails_alone(model):
    engine = EmbeddedEngine(model, config=EngineConfig(num_pages=6, page_size=8, max_model_len=64))
    results = engine.generate([req("ok", 10, 8), req("too-long", 70, 4), req("no-pages", 40, 20),
                               GenerationRequest("bad-id", (151_936,), SamplingParams(max_tokens=2))])
    by_id = {r.request_id: r for r in results}
    assert by_id["ok"].ok and len(by_id["ok"].token_ids) == 8
    assert "max_model_len=64" in by_id["too-long"].error
    assert "needs 8 KV pages" in by_id["no-pages"].error and "the cache has 6" in by_id["no-pages"].error
    assert "token ids must lie in" in by_id["bad-id"].error
    assert all(r.finish_reason == "error" for r in results if r.request_id != "ok")


def test_stop_tokens_and_bad_sampling():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="max_batch_tokens must be >= max_num_seqs"):
        EngineConfig(max_num_seqs=8, max_batch_tokens=4)


def test_load_weights_in_place_and_contract_switch(model):
    engine = EmbeddedEngine(build_model(preset("tiny"), seed=11))
    r = req("w", 12, 6)
    before = engine.generate([r])[0]
    new = build_model(preset("tiny"), seed=12).state_dict()
    checksum = engine.load_weights(new, version=1)
    assert checksum == weights_checksum(new) and engine.weight_version == 1
    after = engine.generate([r])[0]
    assert after.weight_version == 1 and after.raw_logprobs != before.raw_logprobs
    fresh = EmbeddedEngine(build_model(preset("tiny"), seed=12)).generate([r])[0]
    assert_bitwise_equal(torch.tensor(after.raw_logprobs), torch.tensor(fresh.raw_logprobs), "synced vs fresh")
    with pytest.raises(ValueError, match="missing"):
        engine.load_weights({}, version=2)
    native = NumericsContract.default().with_ops(attention="native")
    engine.set_contract(native)
    assert engine.generate([r])[0].contract_fingerprint == native.fingerprint()


def test_an_engine_released_between_calls_holds_no_cache_and_gives_the_same_bits(model):
    """`release_when_idle`: the KV cache is freed when each call returns (a colocated trainer gets the
    memory) and allocated again by the next; generate and score come out as an engine that keeps it."""
    import weakref

    shape = dict(max_num_seqs=3, max_batch_tokens=24, page_size=8, num_pages=64)
    keeping = EmbeddedEngine(model, config=EngineConfig(**shape))
    releasing = EmbeddedEngine(model, config=EngineConfig(**shape, release_when_idle=True))
    assert not releasing.allocated, "a releasing engine allocates at its first call"
    calls = [[req("p", 30, 9), req("q", 5, 14, temperature=0.7)], [req("r", 12, 7), req("s", 41, 3)]]
    freed = []
    for reqs in calls:
        for r in reqs:
            releasing.add_request(r)
        done = {res.request_id: res for res in releasing.step()}  # one step in: the cache exists while
        assert releasing.allocated  # requests are in flight ...
        freed.append(weakref.ref(releasing.cache.k[0]))
        with pytest.raises(RuntimeError, match="in flight"):
            releasing.release()
        done.update((res.request_id, res) for res in releasing.run_until_done())
        assert not releasing.allocated and freed[-1]() is None, "... and is freed when the call returns"
        for r, kept in zip(reqs, keeping.generate(reqs)):
            got = done[r.request_id]
            assert got.token_ids == kept.token_ids, r.request_id
            assert_bitwise_equal(torch.tensor(got.raw_logprobs), torch.tensor(kept.raw_logprobs), r.request_id)
    seqs = [list(r.prompt_ids) for r in calls[0]]
    for got, kept in zip(releasing.score(seqs), keeping.score(seqs)):
        assert_bitwise_equal(got, kept, "score after a release")
    assert not releasing.allocated
