"""What every strict Triton kernel shares: the import guard, when a launcher may run, launch options.

Why a shim: rlkit's strict path must import on machines without Triton (the torch references are the
contract and run anywhere); the kernels files decorate their kernels with `jit` from here, which is
`triton.jit` when Triton is installed and a pass-through otherwise.

When Triton kernels run:
- `on_gpu(*tensors)`: every tensor is on a CUDA device and Triton is importable; `rlkit.ops` then uses
  the kernels for the strict path (each op module's `strict(...)` asks this);
- `interpreting()`: `TRITON_INTERPRET=1` was set before this module was imported; the launchers then
  accept CPU tensors (tests/kernels/test_triton_interpret.py runs the kernels' logic that way).

What a plan may know of the GPU (`gpu_traits`: backend, chip, compute units, shared memory) comes from
here too; `assume_gpu` lets the compile check ask the plan functions what another target (MI300X,
H200) would get, on a machine without it.

Launch options that decide bits come from the contract, here, once: `gpu.fp_fusion=False` turns off the
compiler's fusing of a*b + c into one FMA, so every kernel rounds exactly where its source says. Two
kernels that share a @jit helper (attention's split state and its merge) then give the same bits
wherever they run.

Sizes that change from call to call within a run (rows, M, the block table's width) are marked
`do_not_specialize` on their kernels: otherwise Triton compiles a new variant the first time such an
integer is a multiple of 16 or 1, at any step (tests/kernels/test_specialization.py says which and why).
"""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
    jit = triton.jit
except ImportError:  # pragma: no cover - the references still work without Triton
    HAVE_TRITON = False
    triton = None

    class _StubLanguage:
        constexpr = object

    tl = _StubLanguage()

    def jit(fn=None, **_):
        return fn if fn is not None else (lambda f: f)


INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"



@dataclass(frozen=True)
class Launch:
    """One kernel launch as its launcher decided it, returned to the caller that asks (the benchmarks):
    which kernel, its plan (tiles, warps, stages, grid) and the compiled kernel Triton gave back."""

    kernel: str
    """The kernel's role, e.g. "swapped", "tiles", "fused", "split"."""
    plan: dict
    """The launch configuration the launcher chose (none of it changes a bit)."""
    compiled: object
    """What `kernel[grid](...)` returned: Triton's compiled kernel (None under the interpreter)."""

    @property
    def registers(self) -> int:
        return getattr(self.compiled, "n_regs", -1)

    @property
    def spills(self) -> int:
        return getattr(self.compiled, "n_spills", -1)


def interpreting() -> bool:
    return HAVE_TRITON and INTERPRET


def on_gpu(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernels should run for these tensors (all on CUDA, Triton importable)."""
    return HAVE_TRITON and not INTERPRET and all(t.is_cuda for t in tensors)


def launch_options(contract) -> dict:
    """Options for `kernel[grid](..., **launch_options(contract), num_warps=..., num_stages=...)`: what
    the contract lets the compiler do (`gpu.fp_fusion`). The interpreter runs the source as written."""
    return {} if INTERPRET else {"enable_fp_fusion": contract.gpu.fp_fusion}


@dataclass(frozen=True)
class GpuTraits:
    """What a launch plan may read about the GPU besides the shapes: which compiler backend, which chip,
    how many compute units, how much shared memory (LDS) one program may use. None of it changes a bit:
    plans choose tiles and grids, never the reduction order."""

    backend: str
    """"cuda" (NVIDIA) or "hip" (AMD ROCm; torch calls those devices "cuda" too)."""
    arch: str
    """"sm_90" (H200), "gfx942" (MI300X), ..."""
    sm_count: int
    """Streaming multiprocessors (CUDA) or compute units (HIP)."""
    max_shared_bytes: int
    """Shared memory / LDS one program may allocate (Triton refuses to load a kernel that asks more)."""


_ASSUMED_GPU: ContextVar[GpuTraits | None] = ContextVar("rlkit_assumed_gpu", default=None)
_GPU_TRAITS: dict[int, GpuTraits] = {}
"""CUDA device index -> its traits, read once from the driver."""


@contextlib.contextmanager
def assume_gpu(traits: GpuTraits) -> Iterator[GpuTraits]:
    """Plan for `traits` instead of the device at hand, inside the block (per thread / task; restored on
    exit): the compile check (rlkit/bench/compile_targets.py) asks the plan functions which launch each
    target gets, on a machine without that GPU."""
    token = _ASSUMED_GPU.set(traits)
    try:
        yield traits
    finally:
        _ASSUMED_GPU.reset(token)


def gpu_traits(device: torch.device) -> GpuTraits | None:
    """The traits plans use for `device`: the assumed ones inside `assume_gpu`, else the CUDA/ROCm
    device's own, else None (CPU tensors: the interpreter)."""
    assumed = _ASSUMED_GPU.get()
    if assumed is not None:
        return assumed
    if device.type != "cuda":
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _GPU_TRAITS:
        props = torch.cuda.get_device_properties(idx)
        hip = torch.version.hip is not None
        _GPU_TRAITS[idx] = GpuTraits(
            backend="hip" if hip else "cuda",
            arch=props.gcnArchName.split(":")[0] if hip else f"sm_{props.major}{props.minor}",
            sm_count=props.multi_processor_count,
            max_shared_bytes=int(getattr(props, "shared_memory_per_block_optin", 0) or 0))
    return _GPU_TRAITS[idx]


def sm_count(device: torch.device) -> int:
    """Compute units of the device plans are made for (4 for CPU tensors under the interpreter)."""
    traits = gpu_traits(device)
    return 4 if traits is None else traits.sm_count


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
