"""Strict RMSNorm (with the optional residual add): y = weight * x / sqrt(mean(x^2) + eps).

Contract (RmsNormSpec): the residual add rounds to the model dtype; squares are fp32 and summed over the
hidden dim by the canonical pairwise tree (no torch reduction, whose order follows shapes and threads);
mean = sum / hidden; rstd = rsqrt(mean + eps) (the rsqrt primitive); x * rstd in fp32, then either rounded
to the model dtype and multiplied by the weight there (`model_dtype`, the HF Qwen3 order) or multiplied
in fp32 and rounded once (`float32`). Each row is computed from its own values only: batch-invariant.
"""

from __future__ import annotations

import torch

from rlkit.contract import NumericsContract
from rlkit.kernels.errors import OpInputError, check_float, check_same
from rlkit.kernels.tree import pairwise_sum_dim

OP = "rms_norm"


def check_inputs(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    check_float(OP, "x", x)
    check_float(OP, "weight", weight)
    check_same(OP, x=x, weight=weight)
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise OpInputError(OP, f"x has shape {tuple(x.shape)} and weight {tuple(weight.shape)}; "
                               f"expected x [..., H] and weight [H]")
    if residual is not None:
        check_same(OP, x=x, residual=residual)
        if residual.shape != x.shape:
            raise OpInputError(OP, f"residual has shape {tuple(residual.shape)}; expected x's "
                                   f"{tuple(x.shape)}")


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, contract: NumericsContract,
              residual: torch.Tensor | None = None):
    """Returns y, or (y, x + residual) when a residual is given."""
    check_inputs(x, weight, residual)
    if residual is not None:
        x = x + residual  # rounds to the model dtype (RmsNormSpec.residual_add)
    xf = x.float()
    sum_sq = pairwise_sum_dim(xf * xf, -1)
    rstd = torch.rsqrt(sum_sq / x.shape[-1] + eps)
    normed = xf * rstd.unsqueeze(-1)
    if contract.rms_norm.weight_multiply == "model_dtype":
        y = normed.to(x.dtype) * weight
    else:
        y = (normed * weight.float()).to(x.dtype)
    return y if residual is None else (y, x)


def native(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """The HF Qwen3 RMSNorm as written there (torch.mean decides the reduction order)."""
    check_inputs(x, weight, residual)
    if residual is not None:
        x = x + residual
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    y = weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)
    return y if residual is None else (y, x)
