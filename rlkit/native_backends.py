"""Which kernels the native path stands for on each kind of device, by name, and where rlkit ran them.

The native path (`rlkit.ops` with an op set to "native") is the control: what frameworks run today.
rlkit's native ops are mostly plain torch calls (on CUDA, without autograd, a serving engine's fused
norm / rotary / activation and paged-decode kernels in Triton), so what computes is mostly the device's
torch backend:
MKL / oneDNN on the CPU, cuBLAS and cuDNN/flash SDPA on NVIDIA GPUs, hipBLASLt and AOTriton SDPA under
ROCm. On AMD MI300X the source system's native control is AMD's `aiter` kernels (the ROCm-only
package `amd-aiter`; the PyPI package named `aiter` is an unrelated project). rlkit does not call aiter:
on a ROCm device its native ops would run torch's ROCm kernels, and none of that is exercised here,
because no AMD GPU is reachable and `amd-aiter` installs only under ROCm. The strict kernels are
compiled for MI300X (gfx942) in CI (rlkit/bench/compile_targets.py), never run.

    >>> from rlkit import ops
    >>> ops.native_backend(torch.device("cpu")).name
    'torch-cpu'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NativeBackend:
    """The native control on one kind of device."""

    name: str
    """The control's name: "torch-cpu", "torch-cuda", "amd-aiter"."""
    device_kind: str
    """"cpu", "cuda" (NVIDIA) or "hip" (AMD ROCm, which torch also calls "cuda")."""
    rlkit_runs: str
    """What rlkit's native ops call on this device."""
    exercised: str
    """Where rlkit ran its native path on this device kind, or "not exercised" and why."""


NATIVE_BACKENDS: dict[str, NativeBackend] = {
    "cpu": NativeBackend(
        "torch-cpu", "cpu", "torch: MKL / oneDNN GEMM, ATen SDPA and log_softmax, gloo all-reduce",
        "CI: the negative controls (tests/negative.py) and the lab's native runs"),
    "cuda": NativeBackend(
        "torch-cuda", "cuda", "torch: cuBLAS GEMM, flash / cuDNN SDPA prefill, NCCL all-reduce; rlkit's Triton "
        "split-K paged flash-decoding and fused residual-add + RMSNorm, cached-table RoPE and silu * up "
        "(without autograd), chunked lm_head + logprob above 4,096 rows",
        "the lent H200: native controls of tests/gpu and the benchmarks (BENCHMARKS.md)"),
    "hip": NativeBackend(
        "amd-aiter", "hip", "torch on ROCm (hipBLASLt GEMM, AOTriton SDPA, RCCL); aiter's kernels are not "
        "wired in",
        "not exercised: no AMD GPU is reachable here and amd-aiter is ROCm-only (the PyPI 'aiter' is "
        "unrelated); the strict kernels only compile for gfx942 in CI"),
}
"""device kind -> its native control."""


def device_kind(device: torch.device) -> str:
    """"cpu", "cuda" or "hip" for a torch device (a ROCm build reports its GPUs as "cuda")."""
    device = torch.device(device)
    if device.type == "cuda":
        return "hip" if torch.version.hip is not None else "cuda"
    return "cpu" if device.type == "cpu" else device.type


def native_backend(device: torch.device) -> NativeBackend:
    """The native control for `device`; a device kind rlkit has no control for raises ValueError."""
    kind = device_kind(device)
    if kind not in NATIVE_BACKENDS:
        raise ValueError(f"no native backend is known for device {device} (kind {kind!r}); known: "
                         f"{', '.join(NATIVE_BACKENDS)}")
    return NATIVE_BACKENDS[kind]
