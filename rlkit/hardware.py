"""What this machine's CPU does natively, and the dtype a CPU run should compute in because of it.

The CPU machines rlkit runs on differ: some Intel CPUs have AMX and AVX-512 BF16 (bf16 GEMMs run on
matrix units), others only AVX-512 or, on AMD EPYC, only AVX2. Without AMX or AVX-512 BF16, torch's bf16
matmul falls back to a slow path (measured on an AVX2-only EPYC: 4.6 s in bf16 vs 0.8 s in fp32 for a
256 x 128 x 151,936 product), so a CPU run that is not asked for a dtype computes in fp32 there.

    from rlkit import hardware
    hardware.describe()                  # {"cpu": "...", "isa": [...], "torch_cpu_capability": ..., ...}
    hardware.default_dtype("cpu")        # ("float32", "this CPU has no AMX or AVX-512 BF16: ...")

Nothing here moves a bit of a strict result: the dtype is part of the run's config (stored with it), and
the strict contract's bits are defined per dtype.

## Pinning the instruction set (the strict CPU bits across CPUs)
The one place that names the environment variables the strict CPU bits depend on, and what they pin.

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

import functools
import os
import platform as _py_platform
import re
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of the units that run bf16 GEMMs at full speed."""
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str], str]:
    """(model name, flags, vendor id) of the first CPU in /proc/cpuinfo."""
    model, flags, vendor = _py_platform.processor() or _py_platform.machine(), frozenset(), ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags, vendor
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and value:
            model = value
        elif key == "flags":
            flags = frozenset(value.split())
        elif key == "vendor_id":
            vendor = value
    return model, flags, vendor


def cpu_model() -> str:
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    return _cpuinfo()[1]


def cpu_vendor() -> str:
    """GenuineIntel, AuthenticAMD, ... (empty where /proc/cpuinfo does not say)."""
    return _cpuinfo()[2]


def has_native_bf16() -> bool:
    """True where the CPU has AMX or AVX-512 BF16 units (torch's bf16 GEMM is fast there)."""
    return any(f in cpu_flags() for f in NATIVE_BF16_FLAGS)


def default_dtype(device: str) -> tuple[str, str]:
    """(dtype, why) for a run that did not name one: bf16 on GPUs and on CPUs with native bf16 GEMMs,
    fp32 on other CPUs."""
    if not str(device).startswith("cpu"):
        return "bfloat16", f"{device}: bf16 is the accelerator's native dtype"
    if has_native_bf16():
        have = [f for f in NATIVE_BF16_FLAGS if f in cpu_flags()]
        return "bfloat16", f"this CPU runs bf16 GEMMs natively ({', '.join(have)})"
    return "float32", ("this CPU has no AMX or AVX-512 BF16, so torch's bf16 GEMM falls back to a slow "
                       "path; fp32 GEMMs run on its vector units")


def numpy_openblas_core() -> str | None:
    """The OpenBLAS kernel family numpy picked at run time on this CPU (what `tl.dot` runs under Triton's
    interpreter), or None where numpy is not built on OpenBLAS."""
    import ctypes
    import glob
    import os

    import numpy

    libs = os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs")
    for lib in glob.glob(os.path.join(libs, "*openblas*")):
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            fn = getattr(handle, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def _build_version(pattern: str) -> str:
    """A library version from torch's build description (`torch.__config__.show()`), or "none"."""
    found = re.search(pattern, torch.__config__.show())
    return found.group(1) if found else "none"


MKL_VERSION = r"Math Kernel Library Version ([\d.]+)"
ONEDNN_VERSION = r"(?:oneDNN|MKL-DNN) v([\d.]+)"


def describe() -> dict:
    """The facts a result depends on: CPU model, the ISA flags that matter, torch's CPU kernel level, the
    BLAS torch was built with."""
    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "native_bf16": has_native_bf16(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_blas": "MKL" if torch.backends.mkl.is_available() else "other",
        "onednn": _build_version(ONEDNN_VERSION),
        "numpy_openblas_core": numpy_openblas_core(),
    }


def summary() -> str:
    """One line for logs and skip reasons."""
    d = describe()
    return (f"{d['cpu']} [{' '.join(d['isa']) or 'no AVX2'}; torch {d['torch']} CPU kernels "
            f"{d['torch_cpu_capability']}, BLAS {d['torch_blas']}; native bf16 {'yes' if d['native_bf16'] else 'no'}; "
            f"numpy OpenBLAS {d['numpy_openblas_core']}]")


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
    return {
        "torch": torch.__version__,
        "mkl": _build_version(MKL_VERSION),
        "onednn": _build_version(ONEDNN_VERSION),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **{name: os.environ.get(name, "") for name in REPRODUCIBLE_CPU_ENV},
        "machine": _py_platform.machine(),
        "cpu_vendor": cpu_vendor(),
    }


if __name__ == "__main__":  # `python -m rlkit.hardware`: what `make test` prints before the suite
    import json

    print("rlkit.hardware:", summary())
    print("rlkit.hardware:", json.dumps({**describe(), "default_cpu_dtype": default_dtype("cpu")}))
