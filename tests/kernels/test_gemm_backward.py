"""The strict linear's weight gradient split over token slabs (kernels/gemm_backward.py), on the CPU: the
slab arithmetic (every token in exactly one slab, the remainder last) and the split count's rule. Its
speed and its GPU form (cuBLAS's fp32-out batched product) are lab/wgrad_split_h200.py's and
tests/gpu/test_native_kernels_gpu.py's."""

import pytest
import torch

from rlkit.bitwise import assert_bitwise_equal
from rlkit.kernels import gemm_backward


def _exact(*shape, seed):
    """Small integers: every product and partial sum is an exact fp32 integer, so any order of the token
    sum gives the same bits and a token counted twice or missed changes them."""
    return torch.randint(-3, 4, shape, generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 7])
def test_slabs_sum_every_token_once(splits):
    g, x = _exact(1001, 48, seed=1), _exact(1001, 40, seed=2)  # 1001: a remainder for 2, 3, 4 and 7
    assert_bitwise_equal(gemm_backward.weight_grad(g, x, splits), g.t() @ x, f"dW in {splits} token slabs")


def test_autograd_of_the_strict_linear_takes_the_split_weight_gradient(monkeypatch):
    """_StrictLinear's backward asks weight_grad for dW (here forced to 3 slabs) and the products for dX."""
    from rlkit import NumericsContract
    from rlkit.kernels import gemm

    seen = []
    real = gemm_backward.weight_grad

    def spy(g2, x2, splits=None):
        seen.append(tuple(g2.shape))
        return real(g2, x2, 3)

    monkeypatch.setattr(gemm, "weight_grad", spy)
    x, w = _exact(2, 300, 64, seed=3).requires_grad_(True), _exact(32, 64, seed=4).requires_grad_(True)
    go = _exact(2, 300, 32, seed=5)
    gemm.strict(x, w, NumericsContract.default()).backward(go)
    assert seen == [(600, 32)]
    assert_bitwise_equal(w.grad, go.reshape(-1, 32).t() @ x.detach().reshape(-1, 64), "dW through autograd")
    assert_bitwise_equal(x.grad, go @ w.detach(), "dX through autograd")


def test_split_count_fills_the_waves_only_without_a_workspace(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(gemm_backward._tr, "sm_count", lambda device: 132)
    monkeypatch.setattr(gemm_backward, "_no_workspace", lambda: True)
    assert gemm_backward.wgrad_splits(8192, 1024, 1024, cuda) == 2  # 64 tiles: 0.48 of a wave, 128: 0.97
    assert gemm_backward.wgrad_splits(8192, 2048, 1024, cuda) == 1  # 128 tiles fill one wave
    assert gemm_backward.wgrad_splits(8192, 3072, 1024, cuda) == 2  # 192 tiles: 0.73 of two waves
    assert gemm_backward.wgrad_splits(8192, 128, 128, cuda) == 8  # one tile: as many slabs as allowed
    assert gemm_backward.wgrad_splits(700, 1024, 1024, cuda) == 1  # slabs of 350 tokens: too few
    assert gemm_backward.wgrad_splits(8192, 1024, 1024, torch.device("cpu")) == 1
    monkeypatch.setattr(gemm_backward, "_no_workspace", lambda: False)
    assert gemm_backward.wgrad_splits(8192, 1024, 1024, cuda) == 1  # cuBLAS splits K itself
