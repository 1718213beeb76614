"""Layout invariance on the CPU (gloo): a rollout engine sharded over 2 and 4 tensor-parallel ranks records
the logprobs of the unsharded engine bit for bit (strict), and a Megatron trainer at TP 2 and TP 1
recomputes exactly what the TP-4 rollout recorded. `tiny` has 4 query heads over 2 KV heads, so TP 4 also
replicates KV heads (one query head a rank). The native contract is the control: its row-parallel
products are reduced by the backend's all-reduce, in the model dtype."""

from __future__ import annotations

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.model import build_model, preset
from rlkit.model.parallel import TensorParallel, shard_state_dict, unshard_state_dicts
from rlkit.rollout.engine import EmbeddedEngine
from rlkit.rollout.types import GenerationRequest
from rlkit.types import SamplingParams
from tests.distributed import run_ranks

SEED = 3
STRICT, NATIVE = NumericsContract.default(), NumericsContract.native()


def requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(2)
    return [GenerationRequest(f"t{i}", tuple(torch.randint(0, 151_000, (n,), generator=g).tolist()),
                              SamplingParams(max_tokens=m, seed=i, temperature=0.9, top_p=0.95), logprobs_mode="both")
            for i, (n, m) in enumerate([(6, 9), (21, 7), (3, 12)])]


def generate(model, contract):
    out = EmbeddedEngine(model, contract).generate(requests())
    assert all(r.ok for r in out), [r.error for r in out]
    return [(r.token_ids, torch.tensor(r.raw_logprobs), torch.tensor(r.processed_logprobs)) for r in out]


def _rollout_rank(rank, world, dtype, path):
    """Every rank runs the same scheduler and samples from the same (whole) logits."""
    import torch.distributed as dist

    cfg = preset("tiny").with_dtype(dtype)
    model = build_model(cfg, seed=SEED, tp=TensorParallel(world, rank, dist.group.WORLD))
    assert model.kv_heads == max(1, cfg.num_key_value_heads // world)
    return generate(model, STRICT if path == "strict" else NATIVE)


def _trainer_rank(rank, world, sequences, prompt_lens):
    from rlkit.train.megatron import MegatronTrainConfig, MegatronTrainer
    from rlkit.train.trainer import OptimConfig

    cfg = preset("tiny")
    trainer = MegatronTrainer(cfg, build_model(cfg, seed=SEED).state_dict(),
                              config=MegatronTrainConfig(tp=world, pp=1, optim=OptimConfig(lr=1e-3)))
    trainer.contract = STRICT
    return torch.cat(trainer.response_logprobs(sequences, prompt_lens))


@pytest.fixture(scope="module")
def unsharded():
    return {(d, p): generate(build_model(preset("tiny").with_dtype(d), seed=SEED), STRICT if p == "strict" else NATIVE)
            for d in ("bfloat16", "float32") for p in ("strict", "native")}


@pytest.fixture(scope="module")
def tp4():
    return run_ranks(4, _rollout_rank, "bfloat16", "strict")


def assert_same_records(got, want, label):
    for i, ((tok_a, raw_a, pro_a), (tok_b, raw_b, pro_b)) in enumerate(zip(got, want)):
        assert tok_a == tok_b, f"{label}: request {i} sampled other tokens"
        assert_bitwise_equal(raw_a, raw_b, f"{label}: request {i} raw")
        assert_bitwise_equal(pro_a, pro_b, f"{label}: request {i} processed")


def test_rollout_tp4_equals_unsharded(tp4, unsharded):
    for rank, got in enumerate(tp4):
        assert_same_records(got, unsharded[("bfloat16", "strict")], f"TP4 rank {rank} vs TP1")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rollout_tp2_equals_unsharded(unsharded, dtype):
    for rank, got in enumerate(run_ranks(2, _rollout_rank, dtype, "strict")):
        assert_same_records(got, unsharded[(dtype, "strict")], f"TP2 {dtype} rank {rank} vs TP1")


def test_native_tp2_control(unsharded):
    """fp32 native: the backend's all-reduce adds the two ranks' rounded partials, not the tree."""
    got = run_ranks(2, _rollout_rank, "float32", "native")[0]
    want = unsharded[("float32", "native")]
    same_tokens = [a[0] == b[0] for a, b in zip(got, want)]
    raw = [compare(a[1], b[1]) for a, b in zip(got, want) if a[0] == b[0]]
    print(f"native fp32 TP2 vs TP1: {sum(same_tokens)}/{len(want)} requests sampled the same tokens; raw logprobs "
          f"differ in {sum(r.differing for r in raw)} of {sum(r.total for r in raw)} (max {max(r.max_abs_diff for r in raw):.3g})")
    assert not all(same_tokens) or sum(r.differing for r in raw) > 0


@pytest.mark.megatron
@pytest.mark.parametrize("trainer_tp", [1, 2])
def test_megatron_trainer_equals_rollout_tp4(tp4, trainer_tp):
    """Trainer TP 1 and 2 against rollout TP 4: what the sharded rollout recorded while decoding is what the
    differently sharded trainer recomputes."""
    reqs = requests()
    sequences = [list(r.prompt_ids) + tok for r, (tok, _, _) in zip(reqs, tp4[0])]
    prompt_lens = [len(r.prompt_ids) for r in reqs]
    trainer = run_ranks(trainer_tp, _trainer_rank, sequences, prompt_lens)[0]
    assert_bitwise_equal(trainer, torch.cat([raw for _, raw, _ in tp4[0]]),
                         f"Megatron TP{trainer_tp} recompute vs rollout TP4 decode")


def test_shards_reassemble_and_bad_layouts_are_refused():
    cfg = preset("tiny")
    full = build_model(cfg, seed=SEED).state_dict()
    parts = [shard_state_dict(full, cfg, TensorParallel(2, r)) for r in range(2)]
    name_q, name_o = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(torch.cat([p[name_q] for p in parts]), full[name_q])
    assert torch.equal(torch.cat([p[name_o] for p in parts], dim=1), full[name_o])
    four = [shard_state_dict(full, cfg, TensorParallel(4, r)) for r in range(4)]
    k = "model.layers.0.self_attn.k_proj.weight"  # 2 KV heads on 4 ranks: ranks 0,1 hold head 0
    assert torch.equal(four[0][k], four[1][k]) and torch.equal(torch.cat([four[0][k], four[2][k]]), full[k])
    for shards in (parts, four):
        whole = unshard_state_dicts(shards, cfg)
        assert whole.keys() == full.keys() and all(torch.equal(whole[n], full[n]) for n in full)
    with pytest.raises(ValueError, match="3 ranks"):
        build_model(cfg, tp=TensorParallel(3, 0))
    with pytest.raises(ValueError, match="rank 2 of size 2"):
        TensorParallel(2, 2)
