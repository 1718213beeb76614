"""Strict SwiGLU: silu(gate) * up.

Contract (ElementwiseSpec.swiglu = float32_once): gate and up widened to fp32; sigmoid as 1/(1+exp(-g))
from the exp primitive (torch's own sigmoid/silu take a different code path for the tail of a vector
and change bits with the element's position, see tests/kernels/test_primitives.py); g * sigmoid(g) * up
in fp32; one rounding to the model dtype. Purely elementwise: batch-invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlkit.contract import NumericsContract
from rlkit.kernels.errors import OpInputError, check_float, check_same

OP = "swiglu"


def check_inputs(gate: torch.Tensor, up: torch.Tensor) -> None:
    check_float(OP, "gate", gate)
    check_float(OP, "up", up)
    check_same(OP, gate=gate, up=up)
    if gate.shape != up.shape:
        raise OpInputError(OP, f"gate has shape {tuple(gate.shape)} and up {tuple(up.shape)}; "
                               f"expected equal shapes")


def reference(gate: torch.Tensor, up: torch.Tensor, contract: NumericsContract) -> torch.Tensor:
    check_inputs(gate, up)
    g = gate.float()
    sigmoid = 1.0 / (1.0 + torch.exp(-g))
    return (g * sigmoid * up.float()).to(gate.dtype)


def native(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """HF's act_fn(gate) * up in the model dtype (two roundings, torch's silu)."""
    check_inputs(gate, up)
    return F.silu(gate) * up
