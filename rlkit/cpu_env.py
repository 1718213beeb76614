"""The one place that names the environment variables the strict CPU bits depend on, and what they pin.

Why: the strict CPU references fix every reduction order rlkit controls, but they still call three
libraries whose kernels are chosen by the CPU's instruction set: MKL's fp32 GEMM (every strict linear
chunk; `MKL_VERBOSE=1` shows torch's fp32 `mm` arriving as SGEMM), oneDNN's bf16 matmuls (the native
backward of the trainer) and ATen's vectorized kernels (optimizer, elementwise, reductions). On an
Intel AVX-512 CPU and an AVX2-only CPU those choices differ, and so do the bits. Measured with the golden
run (tests/golden/make.py, lab/LOG.md 2026-12-01) on an Intel AVX-512 Xeon:
- capping MKL at AVX2 (`MKL_ENABLE_INSTRUCTIONS=AVX2`, or `MKL_CBWR=AVX2`: the same bits) changes the
  recorded logprobs from step 0; capping ATen (`ATEN_CPU_CAPABILITY=avx2`) or oneDNN
  (`ONEDNN_MAX_CPU_ISA=AVX2`) alone changes the weights after the first update;
- all three capped reproduce, bit for bit, the run with every library forced to AVX2.
MKL's documentation says `MKL_CBWR=AVX2` is honoured on Intel CPUs only (elsewhere MKL falls back to
its automatic branch), while `MKL_CBWR=COMPATIBLE` (SSE2 without the approximate rcpps/rsqrtps) is the
branch meant to give the same results on Intel and compatible (AMD) CPUs. Hence REPRODUCIBLE_CPU_ENV.

The variables are read when each library first dispatches, so they must be in a process's environment
before torch computes anything. rlkit never writes them into a running process (that would change the
bits of whoever imported it); a caller that wants CPU-independent bits starts a child process with
them (`child_env()`), as the golden run does. They change speed, not correctness: the native path stays
native, only its kernels' instruction set is capped.

    subprocess.run([...], env=child_env())      # a child whose strict CPU bits do not depend on the CPU
    cpu_platform()                              # what the bits of this process depend on
"""

from __future__ import annotations

import os
import platform
import re
from types import MappingProxyType
from typing import Mapping

REPRODUCIBLE_CPU_ENV: Mapping[str, str] = MappingProxyType({
    "MKL_CBWR": "COMPATIBLE",  # MKL's CPU-vendor-independent branch (SGEMM of the strict linear chunks)
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vectorized kernels: the AVX2 build on every x86-64 CPU here
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's bf16 matmuls: at most AVX2 (no AVX-512 / AMX kernels)
})
"""The environment under which the strict CPU path gives the same bits on Intel AVX-512 and AMD AVX2 CPUs."""


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with REPRODUCIBLE_CPU_ENV on top, for a child process."""
    return {**(os.environ if base is None else base), **REPRODUCIBLE_CPU_ENV}


def cpu_platform() -> dict[str, str]:
    """What this process's CPU bits depend on besides rlkit: torch and its MKL / oneDNN builds, ATen's
    instruction set and the CPU-related variables as this process sees them."""
    import torch

    build = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", build)
    onednn = re.search(r"(?:oneDNN|MKL-DNN) v([\d.]+)", build)
    return {
        "torch": torch.__version__,
        "mkl": mkl.group(1) if mkl else "none",
        "onednn": onednn.group(1) if onednn else "none",
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **{name: os.environ.get(name, "") for name in REPRODUCIBLE_CPU_ENV},
        "machine": platform.machine(),
    }
