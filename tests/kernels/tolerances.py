"""Closeness to an fp64 reference: ||out - ref|| / ||ref|| per input dtype (not for bitwise claims).

fp32 arithmetic lands far under 1e-5 for these sizes; bf16 outputs carry one bf16 rounding (2^-9 relative)
plus bf16 inputs to later steps, so 1e-2 bounds them.
"""

import torch

REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))
