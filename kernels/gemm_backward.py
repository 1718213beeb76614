"""The strict linear's backward products (kernels/gemm.py `_StrictLinear`): native products in the model
dtype, not the contract's (only forwards are compared), but repeatable and as fast as a native trainer's.

Why the weight gradient is split here. A process running strict GEMMs runs cuBLAS without a workspace
(kernels/gemm_cublas.py: the route needs it), so cuBLAS cannot split K. The weight gradient dW = g^T x
sums over the step's tokens (K = thousands) into an output the size of the weight: for a 0.6b layer
1,024 x 1,024, 64 tiles of 128 x 128 for 132 SMs, so half the GPU would idle where a native trainer's
cuBLAS (torch's default workspace) splits K. `weight_grad` does the split itself: the tokens in
`splits` equal slabs, one batched product with fp32 outputs (each slab one chain over its tokens), the
slab sums added in slab order and rounded once to the model dtype; a remainder of tokens that does not
divide adds last. The same inputs give the same bits every time (the resume replay needs that,
kernels/determinism.py); the slab count depends only on the shape and the GPU's SM count.
"""

from __future__ import annotations

import torch

from rlkit.kernels import _triton as _tr
from rlkit.kernels import gemm_cublas

WGRAD_TILE = 128
"""Output tile edge the split count plans with (cuBLAS's common 128 x 128 for bf16 on Hopper)."""
WGRAD_FILL = 0.8
"""Smallest wave efficiency (tiles over whole waves of SM-sized tile slots) a split count must reach; the
first count from 1 up that reaches it is taken."""
WGRAD_MAX_SPLITS = 8
WGRAD_MIN_SLAB = 512
"""Tokens a slab at least: below it the fp32 slab outputs cost more memory traffic than the split saves."""


def weight_grad(g2: torch.Tensor, x2: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """dW = g2^T @ x2 ([N, K] in x2's dtype) for g2 [T, N] and x2 [T, K]: one product, or on CUDA without
    a cuBLAS workspace `splits` token slabs (None: `wgrad_splits`) summed in fp32 in slab order."""
    t = g2.shape[0]
    if splits is None:
        splits = wgrad_splits(t, g2.shape[1], x2.shape[1], g2.device)
    if splits <= 1 or (g2.is_cuda and not _has_fp32_out(g2.device)):
        return g2.t() @ x2
    slab = t // splits
    whole = slab * splits
    gs = g2[:whole].reshape(splits, slab, g2.shape[1]).transpose(1, 2)
    xs = x2[:whole].reshape(splits, slab, x2.shape[1])
    parts = _fp32_product(torch.bmm, gs, xs)
    total = parts[0]
    for i in range(1, splits):
        total = total.add_(parts[i])
    if whole < t:
        total = total.add_(_fp32_product(torch.mm, g2[whole:].t(), x2[whole:]))
    return total.to(x2.dtype)


def _fp32_product(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 accumulation and output: cuBLAS's out_dtype form on CUDA; elsewhere (the CPU tests of
    the slab arithmetic) the fp32 product of the operands widened."""
    if a.is_cuda:
        return op(a, b, out_dtype=torch.float32)
    return op(a.float(), b.float())


def wgrad_splits(tokens: int, n: int, k: int, device: torch.device) -> int:
    """Token slabs for dW [n, k] over `tokens`: 1 off CUDA or where this process's cuBLAS has its
    workspace (it splits K itself); else the fewest slabs (up to WGRAD_MAX_SPLITS, each at least
    WGRAD_MIN_SLAB tokens) whose tiles fill the SMs' waves to WGRAD_FILL."""
    if device.type != "cuda" or not _no_workspace():
        return 1
    tiles = -(-n // WGRAD_TILE) * -(-k // WGRAD_TILE)
    sms = _tr.sm_count(device)
    best = 1
    for s in range(1, WGRAD_MAX_SPLITS + 1):
        if s > 1 and tokens // s < WGRAD_MIN_SLAB:
            break
        best = s
        programs = tiles * s
        if programs / (-(-programs // sms) * sms) >= WGRAD_FILL:
            break
    return best


def _no_workspace() -> bool:
    return gemm_cublas.environment_problem() is None


def accumulate_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b for half operands and an fp32 acc: on CUDA one cuBLAS call with beta = 1 writing acc
    (torch >= 2.8's out_dtype; a trainer's fused fp32 weight-gradient accumulation); elsewhere, or where
    this torch lacks it, the product in the operands' dtype, widened and added."""
    if acc.is_cuda and a.dtype != acc.dtype and _has_fp32_out(acc.device):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += (a @ b).float()


_FP32_OUT: dict[str, bool] = {}


def _has_fp32_out(device: torch.device) -> bool:
    """Whether this torch's bmm and addmm take out_dtype=float32 for half operands on this device (torch
    >= 2.8), addmm accumulating into its own input: checked once on a small exact case."""
    key = str(device)
    if key not in _FP32_OUT:
        a = torch.ones(1, 16, 16, dtype=torch.bfloat16, device=device)
        try:
            acc = torch.full((16, 16), 2.0, device=device)
            torch.addmm(acc, a[0], a[0], out_dtype=torch.float32, out=acc)
            _FP32_OUT[key] = (torch.bmm(a, a, out_dtype=torch.float32).dtype == torch.float32
                              and bool((acc == 18.0).all()))
        except (RuntimeError, TypeError, NotImplementedError):
            _FP32_OUT[key] = False
    return _FP32_OUT[key]
