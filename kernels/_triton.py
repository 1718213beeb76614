"""What every strict Triton kernel shares: the import guard, when a launcher may run, launch options.

Why a shim: rlkit's strict path must import on machines without Triton (the torch references are the
contract and run anywhere); the kernels files decorate their kernels with `jit` from here, which is
`triton.jit` when Triton is installed and a pass-through otherwise.

When Triton kernels run:
- `on_gpu(*tensors)`: every tensor is on a CUDA device and Triton is importable; `rlkit.ops` then uses
  the kernels for the strict path (each op module's `strict(...)` asks this);
- `interpreting()`: `TRITON_INTERPRET=1` was set before this module was imported; the launchers then
  accept CPU tensors (tests/kernels/test_triton_interpret.py runs the kernels' logic that way).

Launch options that decide bits come from the contract, here, once: `gpu.fp_fusion=False` turns off the
compiler's fusing of a*b + c into one FMA, so every kernel rounds exactly where its source says. Two
kernels that share a @jit helper (attention's split state and its merge) then give the same bits
wherever they run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
