"""Strict RMSNorm (with the optional residual add): y = weight * x / sqrt(mean(x^2) + eps).

Contract (RmsNormSpec, field `weight_multiply`; the rest is structure): the residual add rounds to the model dtype; squares are fp32 and summed over the
hidden dim by the canonical pairwise tree (no torch reduction, whose order follows shapes and threads);
mean = sum / hidden; rstd = rsqrt(mean + eps) (the rsqrt primitive); x * rstd in fp32, then either rounded
to the model dtype and multiplied by the weight there (`model_dtype`, the HF Qwen3 order) or multiplied
in fp32 and rounded once (`float32`). Each row is computed from its own values only: batch-invariant.

GPU: the Triton kernel at the end of this file (`strict(...)` picks it for CUDA tensors); it reads
`rms_norm.weight_multiply` (both values) and `gpu.fp_fusion`, and covers every contract.

Native: HF's eager RMSNorm (`native_eager`) on the CPU; on CUDA the fused residual-add + RMSNorm kernel
(`triton_native_rms_norm`, one launch as vLLM's fused_add_rms_norm; under autograd with the fused
backward), with HF's roundings and a free reduction order: the native control's bits answer to nothing.

Backward (`backward`): one for both paths, HF's formula; fused on CUDA (`triton_backward`), autograd over
`native_eager` elsewhere; not in the contract.
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
    """The native control: on CUDA the fused residual-add + RMSNorm kernel a serving engine runs
    (`triton_native_rms_norm`; under autograd with the fused backward, as a trainer's fused norm); on the
    CPU `native_eager`."""
    if _tr.on_gpu(x, weight):
        if _needs_grad(x, weight, residual):
            y, s = _RmsNorm.apply(x, weight, residual, eps, triton_native_rms_norm)
            return y if residual is None else (y, s)
        return triton_native_rms_norm(x, weight, eps, residual)
    return native_eager(x, weight, eps, residual)


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def native_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """The HF Qwen3 RMSNorm as written there (torch.mean decides the reduction order)."""
    check_inputs(x, weight, residual)
    if residual is not None:
        x = x + residual
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    y = weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)
    return y if residual is None else (y, x)


# =====================================================================================================
# Triton (GPU). One program normalizes ROWS rows of one [ROWS, BLOCK_H] tile; ROWS, BLOCK_H and
# num_warps are functions of the hidden size H alone, never of the number of rows, so the tile's layout
# (which thread sums which squares, in which order) is the same for a row alone and for a row among
# 100k: the sum of squares is a fixed reduction, the rest is elementwise. Roundings as the reference:
# the residual add rounds to the model dtype; x * rstd in fp32; `model_dtype` rounds before the weight
# multiply, `float32` after it. rsqrt is the hardware's rsqrt.approx (the GPU's named primitive).
# =====================================================================================================
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels._triton import jit, tl  # noqa: E402


@jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, n_rows, H, eps,
                     HAS_RES: tl.constexpr, W_FP32: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK_H: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < H)
    offs = rows[:, None] * H + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # the bf16 add
        tl.store(s_ptr + offs, x, mask=mask)
    xf = x.to(tl.float32)
    sum_sq = tl.sum(xf * xf, axis=1)
    # mean = sum / H, an IEEE fp32 division (Triton's `/` is div.full, approximate), as the reference
    rstd = tl.math.rsqrt(tl.math.div_rn(sum_sq, tl.zeros_like(sum_sq) + H) + eps)
    normed = xf * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    if W_FP32:
        y = normed * w[None, :]
    else:
        y = normed.to(y_ptr.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _tile(h: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK_H, num_warps) for hidden size h: about 4K elements a program (head_dim 128 norms get
    32 rows a program, hidden 4096 one), 4 warps up to 1024 columns, 8 beyond."""
    block_h = _tr.next_pow2(h)
    rows = max(1, min(32, 4096 // block_h))
    return rows, block_h, (4 if block_h <= 1024 else 8)


def _row_buffers(x, residual):
    """x and the residual as contiguous [rows, H], the output y, and the sum's buffer (y itself when
    there is no residual): what both GPU launchers hand their kernel."""
    h = x.shape[-1]
    x2 = x.reshape(-1, h).contiguous()
    r2 = residual.reshape(-1, h).contiguous() if residual is not None else x2
    y = torch.empty_like(x2)
    return x2, r2, y, (torch.empty_like(x2) if residual is not None else y)


def triton_rms_norm(x, weight, eps, contract, residual=None):
    check_inputs(x, weight, residual)
    h = x.shape[-1]
    x2, r2, y, s = _row_buffers(x, residual)
    rows, block_h, warps = _tile(h)
    n = x2.shape[0]
    if n:
        _rms_norm_kernel[(_tr.cdiv(n, rows),)](
            x2, r2, weight, y, s, n, h, float(eps), HAS_RES=residual is not None,
            W_FP32=contract.rms_norm.weight_multiply == "float32", ROWS=rows, BLOCK_H=block_h,
            num_warps=warps, **_tr.launch_options(contract))
    y = y.view(x.shape)
    return y if residual is None else (y, s.view(x.shape))


def backward(x, weight, residual, eps, gy, gs):
    """Gradients of HF's RMSNorm (the sum x + residual rounded to the model dtype, x * rstd rounded
    before the weight multiply) at x, weight, residual: (gx, gw, g_residual or None). gs: the gradient
    reaching the sum output (None or empty when unused). On CUDA one fused launch (`triton_backward`);
    elsewhere HF's formula re-run by torch autograd. Both paths' autograd use it (no part of the contract:
    gradients are not compared, and one backward keeps a training step's strict/native ratio the price of
    the forward)."""
    has_gs = gs is not None and gs.numel() > 0
    if _tr.on_gpu(x, weight, gy):
        gx, gw = triton_backward(x, weight, residual, eps, gy, gs if has_gs else None)
        return gx, gw, (gx if residual is not None else None)
    with torch.enable_grad():
        xx = x.detach().requires_grad_(True)
        ww = weight.detach().requires_grad_(True)
        rr = residual.detach().requires_grad_(True) if residual is not None else None
        s = xx + rr if rr is not None else xx
        y = native_eager(s, ww, eps)
        outs, grads = [y], [gy]
        if rr is not None and has_gs:
            outs.append(s)
            grads.append(gs)
        inputs = [xx, ww] + ([rr] if rr is not None else [])
        g = torch.autograd.grad(outs, inputs, grads, allow_unused=True)
    return g[0], g[1], (g[2] if rr is not None else None)


class _RmsNorm(torch.autograd.Function):
    """Forward: `run(x, weight, eps, residual)` (the strict kernel or reference, or the native fused
    kernel). Backward: `backward`, the one both paths share."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, run):
        ctx.save_for_backward(x, weight, residual if residual is not None else x)
        ctx.has_res, ctx.eps = residual is not None, eps
        out = run(x, weight, eps, residual)
        return out if residual is not None else (out, x.new_empty(0))

    @staticmethod
    def backward(ctx, gy, gs):
        x, weight, residual = ctx.saved_tensors
        return (*backward(x, weight, residual if ctx.has_res else None, ctx.eps, gy, gs), None, None)


def strict(x, weight, eps, contract, residual=None):
    """Strict RMSNorm: the Triton kernel for CUDA tensors, the reference otherwise; under autograd the
    same forward with the shared backward (`backward`)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, residual)):
        kernel = triton_rms_norm if _tr.on_gpu(x, weight) else reference
        y, s = _RmsNorm.apply(x, weight, residual, eps, lambda x_, w, e, r: kernel(x_, w, e, contract, r))
        return y if residual is None else (y, s)
    if _tr.on_gpu(x, weight):
        return triton_rms_norm(x, weight, eps, contract, residual)
    return reference(x, weight, eps, contract, residual)


# =====================================================================================================
# Native control (GPU): the fused residual-add + RMSNorm a serving engine runs instead of HF's ~7 eager
# kernels. HF's roundings (the add in the model dtype, x * rstd rounded to the model dtype before the
# weight multiply), but the sum of squares in whatever order tl.sum picks, mean as a multiply by 1/H,
# and the compiler free to fuse multiply-adds: nothing here is a contract. Launch shape as the strict
# kernel's (`_tile`); no host sync, so decode graphs capture it.
# =====================================================================================================
@jit(do_not_specialize=["n_rows"])
def _native_rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, n_rows, H, inv_h, eps,
                            HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < H)
    offs = rows[:, None].to(tl.int64) * H + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(s_ptr + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) * inv_h + eps)
    normed = (xf * rstd[:, None]).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (normed * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def triton_native_rms_norm(x, weight, eps, residual=None):
    """The native control's fused (residual-add +) RMSNorm: y, or (y, x + residual)."""
    check_inputs(x, weight, residual)
    h = x.shape[-1]
    x2, r2, y, s = _row_buffers(x, residual)
    rows, block_h, warps = _tile(h)
    n = x2.shape[0]
    if n:
        _native_rms_norm_kernel[(_tr.cdiv(n, rows),)](
            x2, r2, weight, y, s, n, h, 1.0 / h, float(eps), HAS_RES=residual is not None, ROWS=rows,
            BLOCK_H=block_h, num_warps=warps)
    y = y.view(x.shape)
    return y if residual is None else (y, s.view(x.shape))


# =====================================================================================================
# Backward (GPU), both paths': a program walks row tiles pid, pid + G, ... (G programs, a function of the
# row count alone), keeps its share of the weight gradient in registers and stores it as one fp32 row of a
# [G, H] buffer that torch then sums: deterministic, no atomics. fp32 math; HF's forward roundings
# replayed (the bf16 sum, x * rstd rounded before the weight multiply); no bit of it is in the contract.
# =====================================================================================================
BACKWARD_PROGRAMS = 512
"""At most this many programs (G) for the backward: enough to fill an H200's 132 SMs several times over,
few enough that the weight gradient's partial rows stay small (G x H fp32)."""


@jit(do_not_specialize=["n_rows", "n_tiles"])
def _rms_norm_backward_kernel(x_ptr, r_ptr, w_ptr, gy_ptr, gs_ptr, gx_ptr, gw_ptr, n_rows, H, n_tiles, eps,
                              HAS_RES: tl.constexpr, HAS_GS: tl.constexpr, ROWS: tl.constexpr,
                              BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    gw = tl.zeros([BLOCK_H], dtype=tl.float32)
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows[:, None] < n_rows) & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * H + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(r_ptr + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / H + eps)
        normed = xf * rstd[:, None]
        rounded = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
        gy = tl.load(gy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        gw += tl.sum(gy * rounded, axis=0)
        gn = gy * w[None, :]
        dot = tl.sum(gn * xf, axis=1) / H
        gx = gn * rstd[:, None] - xf * (rstd * rstd * rstd * dot)[:, None]
        if HAS_GS:
            gx += tl.load(gs_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(gx_ptr + offs, gx.to(gx_ptr.dtype.element_ty), mask=mask)
    tl.store(gw_ptr + pid * H + cols, gw, mask=col_ok)


def triton_backward(x, weight, residual, eps, gy, gs=None):
    """The fused RMSNorm backward: (gx, gw); gx is also the residual's gradient (the sum's)."""
    check_inputs(x, weight, residual)
    h = x.shape[-1]
    x2, r2, _, _ = _row_buffers(x, residual)
    gy2 = gy.reshape(-1, h).contiguous()
    gs2 = gs.reshape(-1, h).contiguous() if gs is not None else gy2
    gx = torch.empty_like(x2)
    rows, block_h, warps = _tile(h)
    n = x2.shape[0]
    tiles = _tr.cdiv(n, rows)
    programs = max(1, min(tiles, BACKWARD_PROGRAMS))
    partial = torch.empty(programs, h, dtype=torch.float32, device=x.device)
    if n:
        _rms_norm_backward_kernel[(programs,)](
            x2, r2, weight, gy2, gs2, gx, partial, n, h, tiles, float(eps), HAS_RES=residual is not None,
            HAS_GS=gs is not None, ROWS=rows, BLOCK_H=block_h, num_warps=warps)
    else:
        partial.zero_()
    return gx.view(x.shape), partial.sum(0).to(weight.dtype)
