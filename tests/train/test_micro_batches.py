"""Gradient accumulation in the embedded trainer (`OptimConfig.micro_batch_tokens`): the same trainer
logprobs bit for bit (strict ops are batch-invariant), the same loss statistics, and the same update up
to the order in which the micro-batches' gradients add up."""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal
from rlkit.config import RunConfig
from rlkit.model import preset
from rlkit.model.qwen3 import build_model
from rlkit.train.trainer import EmbeddedTrainer, OptimConfig, TrainBatch, micro_batches


def test_micro_batches_are_consecutive_groups_within_the_budget():
    assert micro_batches([5, 5, 5], None) == [[0, 1, 2]]
    assert micro_batches([5, 5, 5], 10) == [[0, 1], [2]]
    assert micro_batches([5, 12, 3, 3], 10) == [[0], [1], [2, 3]]  # a longer sequence is a group alone
    assert micro_batches([], 10) == []


def _batch(n: int, seed: int) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    seqs, plens, old, adv, masks = [], [], [], [], []
    for i in range(n):
        p, r = 5 + i % 3, 6 + (2 * i) % 5
        seqs.append(torch.randint(0, 500, (p + r,), generator=g).tolist())
        plens.append(p)
        old.append(-torch.rand(r, generator=g) * 3)
        adv.append(float(torch.randn((), generator=g)))
        masks.append(torch.rand(r, generator=g) > 0.2)
    return TrainBatch(seqs, plens, old, adv, loss_mask=masks)


def _step(micro: int | None, batch: TrainBatch):
    model = build_model(preset("tiny").with_dtype("float32"), seed=3)
    trainer = EmbeddedTrainer(model, NumericsContract.default(), OptimConfig(lr=1e-3, micro_batch_tokens=micro))
    lps, stats = trainer.train_step(batch)
    return lps, stats, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("micro", [24, 40])
def test_micro_batched_step_equals_the_whole_batch(micro):
    batch = _batch(7, seed=1)
    whole_lp, whole_stats, whole_w = _step(None, batch)
    lp, stats, w = _step(micro, batch)
    assert stats["micro_batches"] > 1 and whole_stats["micro_batches"] == 1
    for i, (a, b) in enumerate(zip(lp, whole_lp)):
        assert_bitwise_equal(a, b, f"sequence {i}: trainer logprobs, micro-batched vs whole")
    for key in ("loss", "clip_fraction", "ratio_mean"):
        assert stats[key] == pytest.approx(whole_stats[key], rel=1e-5, abs=1e-7), key
    assert stats["grad_norm"] == pytest.approx(whole_stats["grad_norm"], rel=1e-4)
    for name, t in w.items():
        torch.testing.assert_close(t, whole_w[name], rtol=1e-5, atol=1e-6, msg=name)
    changed = sum(not torch.equal(t, build_model(preset("tiny").with_dtype("float32"), seed=3).state_dict()[n])
                  for n, t in w.items())
    assert changed > 0, "the step moved no weight"


def test_bad_budget_and_megatron_are_refused():
    with pytest.raises(ValueError, match="micro_batch_tokens=0"):
        OptimConfig(micro_batch_tokens=0)
    with pytest.raises(ValueError, match="micro_batch_tokens is the embedded trainer's"):
        RunConfig(trainer="megatron", optim=OptimConfig(micro_batch_tokens=64))
