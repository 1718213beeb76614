"""kernels/determinism.py: torch's deterministic algorithms around a backward only, the caller's settings
restored however the block ends; and native attention's gradient through its replayable wrapper is
torch's own (the wrapper keeps native's graph, it adds no arithmetic)."""

import pytest
import torch

from rlkit.bitwise import assert_bitwise_equal
from rlkit.kernels import attention
from rlkit.kernels.determinism import deterministic_algorithms
from rlkit.types import AttentionLayout


@pytest.fixture
def restore_settings():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = before[2]


@pytest.mark.parametrize("caller", [(False, False), (True, True)])
def test_scope_turns_deterministic_on_and_restores_the_callers_settings(restore_settings, caller):
    torch.use_deterministic_algorithms(caller[0], warn_only=caller[1])
    with deterministic_algorithms():
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled(), "warn-only keeps flash's atomic dQ"
        assert not torch.utils.deterministic.fill_uninitialized_memory
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == caller
    with pytest.raises(KeyError):
        with deterministic_algorithms():
            raise KeyError("a failing backward")
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == caller
    assert torch.utils.deterministic.fill_uninitialized_memory


def test_native_attention_gradient_is_torchs_own_and_its_backward_runs_in_the_scope(monkeypatch):
    gen = torch.Generator().manual_seed(7)
    lens = [3, 17, 9]
    t = sum(lens)
    q, k, v, g = (torch.randn(t, h, 16, generator=gen) for h in (4, 2, 2, 4))
    layout = AttentionLayout.prefill(torch.tensor([0, 3, 20, 29]))
    seen = []
    real_grad = torch.autograd.grad

    def spying_grad(*args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real_grad(*args, **kwargs)

    def grads(fn):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves, layout)
        out.backward(g)
        return out.detach(), [x.grad for x in leaves]

    monkeypatch.setattr(torch.autograd, "grad", spying_grad)
    out, wrapped = grads(attention.native)
    assert seen == [True], f"the wrapper's backward ran {len(seen)} grad call(s), deterministic: {seen}"
    plain_out, plain = grads(attention.native_forward)
    assert_bitwise_equal(out, plain_out, "native forward under the wrapper")
    for name, a, b in zip("qkv", wrapped, plain):
        assert_bitwise_equal(a, b, f"d{name} through the wrapper vs torch's own backward")
    assert not torch.are_deterministic_algorithms_enabled()
