"""Strict rotary position embedding (RoPE), rotate-half convention of Qwen3.

Contract (structure; RoPE has no field): the cos/sin tables are computed in float64 on the CPU, from
inv_freq[i] = theta ** (-2i / head_dim) and the integer position, and rounded to fp32 once; tables are
always built for a whole number of 1024-position blocks so a position's entry never depends on how long
the table is. Applying: x * cos + rotate_half(x) * sin in fp32, rounded once. A row's result depends on
its values and its position only.

GPU: the Triton kernel at the end of this file (`strict(...)` picks it for CUDA tensors); it reads
`gpu.fp_fusion` (launch options) and covers every contract.

Native: HF's eager rotation (`native_eager`, its tables recomputed at each call) on the CPU and under
autograd; on CUDA without a gradient one kernel reading HF's tables from a cache (`native_tables`, per
device, dtype, theta, head_dim and table length), the rotation in fp32 rounded once, as a serving engine's
rotary kernel: the native control's bits answer to nothing.
"""

from __future__ import annotations

import functools
import math

import torch

from rlkit.contract import NumericsContract
from rlkit.kernels.errors import OpInputError, check_float

OP = "rope"
TABLE_BLOCK = 1024


@functools.lru_cache(maxsize=256)
def _table_block(block: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of TABLE_BLOCK positions. Python's scalar libm cos/sin (float64) is used on purpose:
    a vectorized library call may take another code path for some elements depending on the tensor's
    length and thread split; a scalar call per value cannot."""
    half = head_dim // 2
    inv_freq = [theta ** (-(2.0 * i) / head_dim) for i in range(half)]
    angles = [float(p) * f for p in range(block * TABLE_BLOCK, (block + 1) * TABLE_BLOCK) for f in inv_freq]
    cos = torch.tensor([math.cos(a) for a in angles], dtype=torch.float64).view(TABLE_BLOCK, half)
    sin = torch.tensor([math.sin(a) for a in angles], dtype=torch.float64).view(TABLE_BLOCK, half)
    cos, sin = cos.float(), sin.float()
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def _tables_cpu(blocks: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [_table_block(b, head_dim, theta) for b in range(blocks)]
    return torch.cat([c for c, _ in parts]), torch.cat([s for _, s in parts])


_DEVICE_TABLES: dict = {}


def tables(max_position: int, head_dim: int, theta: float, device: torch.device):
    """fp32 (cos, sin) of shape [>= max_position, head_dim] on `device`."""
    blocks = max(1, -(-int(max_position) // TABLE_BLOCK))
    key = (blocks, head_dim, float(theta), str(device))
    if key not in _DEVICE_TABLES:
        cos, sin = _tables_cpu(blocks, head_dim, float(theta))
        _DEVICE_TABLES[key] = (cos.to(device), sin.to(device))
    return _DEVICE_TABLES[key]


def check_inputs(x: torch.Tensor, positions: torch.Tensor) -> None:
    check_float(OP, "x", x)
    if x.dim() != 3:
        raise OpInputError(OP, f"x has shape {tuple(x.shape)}; expected [tokens, heads, head_dim]")
    if x.shape[-1] % 2:
        raise OpInputError(OP, f"head_dim {x.shape[-1]} must be even")
    if positions.dim() != 1 or positions.shape[0] != x.shape[0]:
        raise OpInputError(OP, f"positions has shape {tuple(positions.shape)}; expected [{x.shape[0]}]")
    if positions.dtype not in (torch.int32, torch.int64):
        raise OpInputError(OP, f"positions has dtype {positions.dtype}; expected int32 or int64")
    if positions.device != x.device:
        raise OpInputError(OP, f"positions is on {positions.device} but x is on {x.device}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def reference(x: torch.Tensor, positions: torch.Tensor, theta: float,
              contract: NumericsContract) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; positions: [tokens] absolute positions."""
    check_inputs(x, positions)
    max_pos = int(positions.max()) + 1 if positions.numel() else 1
    cos, sin = tables(max_pos, x.shape[-1], theta, x.device)
    c = cos[positions].unsqueeze(1)
    s = sin[positions].unsqueeze(1)
    xf = x.float()
    return (xf * c + _rotate_half(xf) * s).to(x.dtype)


def native(x: torch.Tensor, positions: torch.Tensor, theta: float, max_position: int | None = None) -> torch.Tensor:
    """The native control: on CUDA RoPE from a cached cos/sin table in one launch (`triton_native_rope`,
    as a serving engine runs it; under autograd with `backward`, the same kernel rotating back);
    otherwise (CPU, a head_dim that is not a power of two) HF's eager rotation (`native_eager`).
    `max_position`: as `triton_rope`."""
    d = x.shape[-1]
    if _tr.on_gpu(x, positions) and d >= 2 and d & (d - 1) == 0:
        if torch.is_grad_enabled() and x.requires_grad:
            return _Rope.apply(x, positions, theta, max_position,
                               lambda x_, p: triton_native_rope(x_, p, theta, max_position))
        return triton_native_rope(x, positions, theta, max_position)
    return native_eager(x, positions, theta)


def _hf_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """HF's tables for `positions`: fp32 inv_freq and angles, cos/sin cast to the model dtype, [n, head_dim]."""
    d = head_dim
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=positions.device).float() / d))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def native_eager(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF's Qwen3 rotary embedding: fp32 inv_freq and angles, tables cast to the model dtype, the
    rotation in the model dtype; the tables recomputed at every call."""
    check_inputs(x, positions)
    cos, sin = _hf_cos_sin(positions, x.shape[-1], theta, x.dtype)
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


NATIVE_TABLE_BLOCK = 4096
"""The native cos/sin cache grows in whole blocks of positions, so nearby maxima share one table."""


@functools.lru_cache(maxsize=64)
def native_tables(device: str, dtype: torch.dtype, theta: float, head_dim: int,
                  max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The native control's cos/sin cache, keyed by everything it depends on: HF's tables (model dtype,
    [max_position, head_dim]) for positions 0 .. max_position - 1, built once on `device`."""
    return _hf_cos_sin(torch.arange(max_position, device=device), head_dim, theta, dtype)


# =====================================================================================================
# Triton (GPU): one program per token applies all its heads; the cos/sin rows come from the same fp32
# tables as the reference (`tables`, built in float64 on the CPU). x * cos + rotate_half(x) * sin in
# fp32 (two products and a sum, each rounded: FMA fusion is off), one rounding. Elementwise per token.
# =====================================================================================================
from rlkit.kernels import _triton as _tr  # noqa: E402
from rlkit.kernels._triton import jit, tl  # noqa: E402


@jit
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, y_ptr, heads, stride_t, stride_h,
                 D: tl.constexpr, BH: tl.constexpr):
    t = tl.program_id(0)
    hs = tl.arange(0, BH)
    ds = tl.arange(0, D)
    half: tl.constexpr = D // 2
    rot = (ds + half) % D  # rotate_half: [-x[half:], x[:half]]
    sign = tl.where(ds < half, -1.0, 1.0)
    mask = hs[:, None] < heads
    base = x_ptr + t.to(tl.int64) * stride_t + hs[:, None] * stride_h
    x = tl.load(base + ds[None, :], mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(base + rot[None, :], mask=mask, other=0.0).to(tl.float32) * sign[None, :]
    p = tl.load(pos_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + p * D + ds)
    s = tl.load(sin_ptr + p * D + ds)
    y = x * c[None, :] + xr * s[None, :]
    out = y_ptr + t.to(tl.int64) * heads * D + hs[:, None] * D + ds[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=mask)


def triton_rope(x, positions, theta, contract, max_position: int | None = None):
    """`max_position`: a bound the caller guarantees (positions < max_position); with it the tables are
    sized without reading `positions` on the host (CUDA-graph capture). Table rows do not depend on
    the table's length, so the bound changes no bit."""
    check_inputs(x, positions)
    t, heads, d = x.shape
    if d & (d - 1):
        return reference(x, positions, theta, contract)
    y = torch.empty(t, heads, d, dtype=x.dtype, device=x.device)
    if t:
        cos, sin = tables(max_position if max_position else int(positions.max()) + 1, d, theta, x.device)
        if x.stride(-1) != 1:
            x = x.contiguous()
        _rope_kernel[(t,)](x, positions, cos, sin, y, heads, x.stride(0), x.stride(1), D=d,
                           BH=_tr.next_pow2(heads), num_warps=4, **_tr.launch_options(contract))
    return y


def backward(gy: torch.Tensor, positions: torch.Tensor, theta: float, max_position: int | None = None):
    """The gradient of a rotation is the inverse rotation, rope at -angle = x*cos - rotate_half(x)*sin.
    On CUDA (power-of-two head_dim) the native kernel from the cached table with sin negated, one launch;
    elsewhere fp32 torch ops over this module's tables. Both paths' autograd use it; not in the contract."""
    d = gy.shape[-1]
    if _tr.on_gpu(gy, positions) and d >= 2 and d & (d - 1) == 0:
        return triton_native_rope(gy, positions, theta, max_position, inverse=True)
    cos, sin = tables(int(positions.max()) + 1, d, theta, gy.device)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    g = gy.float()
    half = d // 2
    # d/dx of x*c + rot(x)*s: g*c + rot^T(g*s), rot^T(z) = [z[half:], -z[:half]]
    gs = g * s
    gx = g * c + torch.cat([gs[..., half:], -gs[..., :half]], dim=-1)
    return gx.to(gy.dtype)


class _Rope(torch.autograd.Function):
    """Forward: `run(x, positions)` (the strict rotation, or the native cached-table one). Backward:
    `backward` (the inverse rotation), the one both paths share."""

    @staticmethod
    def forward(ctx, x, positions, theta, max_position, run):
        ctx.save_for_backward(positions)
        ctx.theta, ctx.max_position = theta, max_position
        return run(x, positions)

    @staticmethod
    def backward(ctx, gy):
        (positions,) = ctx.saved_tensors
        return backward(gy, positions, ctx.theta, ctx.max_position), None, None, None, None


def strict(x, positions, theta, contract, max_position: int | None = None):
    """Strict RoPE: the Triton kernel for CUDA tensors, the reference otherwise; under autograd the same
    forward with the exact inverse rotation as backward. `max_position`: see `triton_rope`."""
    if torch.is_grad_enabled() and x.requires_grad:
        run = (lambda x_, p: triton_rope(x_, p, theta, contract, max_position)) if _tr.on_gpu(x, positions) else (
            lambda x_, p: reference(x_, p, theta, contract))
        return _Rope.apply(x, positions, theta, max_position, run)
    if _tr.on_gpu(x, positions):
        return triton_rope(x, positions, theta, contract, max_position)
    return reference(x, positions, theta, contract)


# =====================================================================================================
# Native control (GPU): one program per token rotates all its heads, cos/sin rows read from the cached
# HF tables (model dtype) instead of recomputed; x * cos + rotate_half(x) * sin in fp32, rounded once
# (HF rounds three times in the model dtype), the compiler free to fuse. No host sync when the caller
# gives `max_position`, so decode graphs capture it (the table is built by the eager warm-up step).
# =====================================================================================================
@jit
def _native_rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, y_ptr, heads, stride_t, stride_h,
                        D: tl.constexpr, BH: tl.constexpr, INVERSE: tl.constexpr = False):
    t = tl.program_id(0)
    hs = tl.arange(0, BH)
    ds = tl.arange(0, D)
    half: tl.constexpr = D // 2
    rot = (ds + half) % D
    sign = tl.where(ds < half, -1.0, 1.0)
    mask = hs[:, None] < heads
    base = x_ptr + t.to(tl.int64) * stride_t + hs[:, None] * stride_h
    x = tl.load(base + ds[None, :], mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(base + rot[None, :], mask=mask, other=0.0).to(tl.float32) * sign[None, :]
    p = tl.load(pos_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + p * D + ds).to(tl.float32)
    s = tl.load(sin_ptr + p * D + ds).to(tl.float32)
    if INVERSE:  # the rotation by -angle: the gradient of the forward one
        s = -s
    out = y_ptr + t.to(tl.int64) * heads * D + hs[:, None] * D + ds[None, :]
    tl.store(out, (x * c[None, :] + xr * s[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def triton_native_rope(x, positions, theta, max_position: int | None = None, inverse: bool = False):
    """The native control's RoPE from the cached table (power-of-two head_dim). `max_position`: a bound
    the caller guarantees; without it the positions are read on the host (not under graph capture).
    inverse: rotate by -angle (RoPE's backward)."""
    check_inputs(x, positions)
    t, heads, d = x.shape
    y = torch.empty(t, heads, d, dtype=x.dtype, device=x.device)
    if t:
        bound = max_position if max_position else int(positions.max()) + 1
        length = -(-bound // NATIVE_TABLE_BLOCK) * NATIVE_TABLE_BLOCK
        cos, sin = native_tables(str(x.device), x.dtype, float(theta), d, length)
        if x.stride(-1) != 1:
            x = x.contiguous()
        _native_rope_kernel[(t,)](x, positions, cos, sin, y, heads, x.stride(0), x.stride(1), D=d,
                                  BH=_tr.next_pow2(heads), INVERSE=inverse, num_warps=4)
    return y
