"""The warm start: computes in fp32 whatever the model's dtype, reports each step, stops between steps."""

import copy
import threading

import pytest
import torch

from rlkit.model import build_model, preset
from rlkit.train.warm_start import WarmStartStopped, warm_start


def test_a_bf16_model_is_trained_in_fp32_and_rounded_once():
    bf16 = build_model(preset("tiny"), seed=3)
    fp32 = copy.deepcopy(bf16).float()
    seen = []
    losses = warm_start(bf16, 2, seed=1, batch_size=8, on_step=seen.append)
    assert losses == warm_start(fp32, 2, seed=1, batch_size=8)
    for (name, a), b in zip(bf16.state_dict().items(), fp32.state_dict().values()):
        assert a.dtype == torch.bfloat16, name
        assert torch.equal(a, b.to(torch.bfloat16)), f"{name}: not the fp32 warm start rounded once"
    assert [(p.step, p.total) for p in seen] == [(1, 2), (2, 2)]
    assert seen[-1].loss == losses[-1] and seen[-1].eta_s == 0.0 and seen[0].elapsed_s > 0


def test_a_stop_request_ends_it_between_steps():
    model = build_model(preset("tiny"), seed=3)
    stop = threading.Event()

    def after_first(progress):
        stop.set()

    with pytest.raises(WarmStartStopped, match="after 1 of 1000 steps"):
        warm_start(model, 1000, seed=1, batch_size=8, stop=stop, on_step=after_first)
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training
