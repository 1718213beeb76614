"""The parity chain on the GPU with the strict Triton kernels, at Qwen3-0.6B, 1.7B and 8B shapes.

Why the three links prove trainer == decode (DESIGN.md): (1) the trainer's logprobs do not depend on how
sequences are packed; (2) the trainer's full-sequence forward equals the rollout engine's (chunked)
prefill through its paged cache; (3) the engine's token-by-token paged decode equals that prefill. So
the logprob the engine recorded while decoding is the logprob the trainer recomputes, bit for bit.
Random weights (bf16, std 0.02) drawn on the GPU; 8B keeps 4 of its 36 layers (the layers are alike;
the lm_head is the real 4096 x 151,936). The native contract runs the same chain as the negative
control and must show mismatches.
"""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import compare
from rlkit.model.config import Qwen3Config
from rlkit.model.qwen3 import Qwen3ForCausalLM, build_model_on_device
from rlkit.rollout.engine import EmbeddedEngine, EngineConfig
from rlkit.train.recompute import response_logprobs

pytestmark = pytest.mark.gpu

SHAPES = {  # the real dimensions (shared/data/qwen3-configs), inlined: the H200 has no shared folder
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=4, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
}
PROMPTS = [5, 40, 300, 17, 90, 260]
RESPONSES = [30, 64, 20, 50, 10, 40]


def gpu_model(name: str, seed: int = 0) -> Qwen3ForCausalLM:
    return build_model_on_device(Qwen3Config(head_dim=128, name=name, **SHAPES[name]), seed, "cuda").eval()


def chain(model, contract):
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPTS]
    responses = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in RESPONSES]
    seqs = [p + r for p, r in zip(prompts, responses)]
    plens = [len(p) for p in prompts]
    from rlkit import ops
    with ops.use_contract(contract):
        train_a = response_logprobs(model, seqs, plens, max_batch_tokens=4096)
        train_b = response_logprobs(model, seqs, plens, max_batch_tokens=300)
    engine = EmbeddedEngine(model, contract, EngineConfig(num_pages=512, max_num_seqs=16, max_batch_tokens=256))
    decode = engine.replay(prompts, responses)
    score = engine.score(seqs)
    cat = lambda ts: torch.cat([t.detach().float().cpu() for t in ts])  # noqa: E731
    prefill = [s[p - 1 :] for s, p in zip(score, plens)]
    return {
        "1 trainer packing A vs B": compare(cat(train_b), cat(train_a), "trainer packed 300 vs 4096 tokens"),
        "2 trainer vs engine prefill": compare(cat(prefill), cat(train_a), "engine prefill vs trainer"),
        "3 engine decode vs prefill": compare(cat(decode), cat(prefill), "engine decode vs engine prefill"),
        "trainer vs decode": compare(cat(decode), cat(train_a), "engine decode vs trainer"),
    }


@pytest.mark.parametrize("name", list(SHAPES))
def test_parity_chain_strict_and_native_control(name):
    model = gpu_model(name)
    strict = chain(model, NumericsContract.default())
    native = chain(model, NumericsContract.native())
    lines = [f"{name} strict: {r}" for r in strict.values()] + [f"{name} native: {r}" for r in native.values()]
    print("\n".join(lines))
    failed = [str(r) for r in strict.values() if not r.equal]
    assert not failed, "\n".join(failed)
    assert not native["trainer vs decode"].equal, "native control showed no mismatch"
