"""Strict SwiGLU: silu(gate) * up.

Contract (structure; SwiGLU has no field): gate and up widened to fp32; sigmoid as 1/(1+exp(-g))
from the exp primitive (torch's own sigmoid/silu take a different code path for the tail of a vector
and change bits with the element's position, see tests/kernels/test_primitives.py); g * sigmoid(g) * up
in fp32; one rounding to the model dtype. Purely elementwise: batch-invariant.

GPU: the Triton kernel at the end of this file (`strict(...)` picks it for CUDA tensors); it reads
`gpu.fp_fusion` (launch options) and covers every contract.

Native: HF's eager act_fn(gate) * up (`native_eager`, two launches) on the CPU; on CUDA one fused launch
(`triton_native_swiglu`) with HF's two roundings, under autograd with the fused backward: the native
control's bits answer to nothing.

Backward (`backward`): one for both paths, fp32, fused on CUDA (`triton_backward`); not in the contract.
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
    """The native control: on CUDA one fused silu(gate) * up launch (`triton_native_swiglu`, vLLM's
    silu_and_mul; under autograd with the fused backward, as a trainer's fused SwiGLU); on the CPU
    `native_eager`."""
    if _tr.on_gpu(gate, up):
        if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
            return _SwiGLU.apply(gate, up, triton_native_swiglu)
        return triton_native_swiglu(gate, up)
    return native_eager(gate, up)


def native_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """HF's act_fn(gate) * up in the model dtype (two roundings, torch's silu)."""
    check_inputs(gate, up)
    return F.silu(gate) * up


# =====================================================================================================
# Triton (GPU): elementwise, so any split of the tensor over programs gives the same bits. fp32 math as
# the reference: sigmoid = 1 / (1 + exp(-g)) with an IEEE division (div_rn) and the GPU's exp
# (ex2.approx of x * log2 e, Triton's fp32 exp), g * sigmoid * up, one rounding.
# =====================================================================================================
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels._triton import jit, tl  # noqa: E402

BLOCK = 2048
"""Elements a program: 16 per thread at 4 warps (two 16-byte bf16 loads per operand)."""


@jit
def _swiglu_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.math.div_rn(tl.full(g.shape, 1.0, tl.float32), 1.0 + tl.exp(-g))
    tl.store(y_ptr + offs, ((g * sig) * u).to(y_ptr.dtype.element_ty), mask=mask)


def triton_swiglu(gate, up, contract):
    check_inputs(gate, up)
    g, u = gate.contiguous(), up.contiguous()
    y = torch.empty_like(g)
    n = g.numel()
    if n:
        _swiglu_kernel[(_tr.cdiv(n, BLOCK),)](g, u, y, n, BLOCK=BLOCK, num_warps=4, **_tr.launch_options(contract))
    return y


def backward(gate: torch.Tensor, up: torch.Tensor, gy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d/d gate and d/d up of silu(gate) * up, in fp32, rounded once to the inputs' dtype: one fused
    launch on CUDA (`triton_backward`), torch ops elsewhere. Both paths' autograd use it (the backward is
    no part of the contract: gradients are not compared, and one backward for strict and native keeps a
    training step's strict/native ratio the price of the forward alone)."""
    if _tr.on_gpu(gate, up, gy):
        return triton_backward(gate, up, gy)
    g, u, d = gate.float(), up.float(), gy.float()
    sig = torch.sigmoid(g)
    d_gate = d * u * sig * (1 + g * (1 - sig))
    d_up = d * g * sig
    return d_gate.to(gate.dtype), d_up.to(up.dtype)


class _SwiGLU(torch.autograd.Function):
    """Forward: `run(gate, up)` (the strict kernel or reference, or the native fused kernel). Backward:
    `backward`, the one both paths share."""

    @staticmethod
    def forward(ctx, gate, up, run):
        ctx.save_for_backward(gate, up)
        return run(gate, up)

    @staticmethod
    def backward(ctx, gy):
        gate, up = ctx.saved_tensors
        return (*backward(gate, up, gy), None)


def strict(gate, up, contract):
    """Strict SwiGLU: the Triton kernel for CUDA tensors, the reference otherwise; under autograd the same
    forward with the shared backward (`backward`)."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        run = (lambda g, u: triton_swiglu(g, u, contract)) if _tr.on_gpu(gate, up) else (
            lambda g, u: reference(g, u, contract))
        return _SwiGLU.apply(gate, up, run)
    if _tr.on_gpu(gate, up):
        return triton_swiglu(gate, up, contract)
    return reference(gate, up, contract)


# =====================================================================================================
# Native control (GPU): silu(gate) * up in one launch, as vLLM's silu_and_mul: silu in fp32 with
# Triton's sigmoid, rounded to the model dtype (HF's act_fn output), times up in fp32, rounded once more.
# =====================================================================================================
@jit
def _native_swiglu_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + offs, (act * u).to(y_ptr.dtype.element_ty), mask=mask)


def triton_native_swiglu(gate, up):
    """The native control's fused silu(gate) * up."""
    check_inputs(gate, up)
    g, u = gate.contiguous(), up.contiguous()
    y = torch.empty_like(g)
    n = g.numel()
    if n:
        _native_swiglu_kernel[(_tr.cdiv(n, BLOCK),)](g, u, y, n, BLOCK=BLOCK, num_warps=4)
    return y


# =====================================================================================================
# Backward (GPU), both paths': elementwise, fp32 math, one rounding of each gradient (torch's formula
# with Triton's sigmoid; no bit of it is in the contract).
# =====================================================================================================
@jit
def _swiglu_backward_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    tl.store(dg_ptr + offs, (d * u * sig * (1.0 + g * (1.0 - sig))).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (d * g * sig).to(du_ptr.dtype.element_ty), mask=mask)


def triton_backward(gate, up, gy):
    """The fused SwiGLU backward: (d gate, d up) in the inputs' dtype, one launch."""
    check_inputs(gate, up)
    g, u, d = gate.contiguous(), up.contiguous(), gy.contiguous()
    dg, du = torch.empty_like(g), torch.empty_like(u)
    n = g.numel()
    if n:
        _swiglu_backward_kernel[(_tr.cdiv(n, BLOCK),)](g, u, d, dg, du, n, BLOCK=BLOCK, num_warps=4)
    return dg, du
