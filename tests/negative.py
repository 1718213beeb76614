"""Negative controls whose difference comes from this CPU's own kernels.

Whether torch's native GEMM, SDPA or silu gives other bits for a row alone, for decode vs prefill, or for
an element's position, is a property of the CPU and of the kernels its BLAS/oneDNN/ATen pick there (an
AVX2-only EPYC and an AVX-512 Intel CPU differ: lab/LOG.md lists what each showed). rlkit guarantees the
strict path's invariance on every CPU; the native path's *difference* is measured. A control calls
`require_native_difference` with its measurement: printed always, and where this CPU shows no difference
the test is skipped with the measurement and the CPU named -- never failed, never passed silently.
"""

from __future__ import annotations

import pytest

from rlkit import hardware


def require_native_difference(differing: int, measurement: str) -> None:
    where = hardware.summary()
    print(f"{measurement} -- on {where}")
    if differing == 0:
        pytest.skip(f"measured: {measurement} on {where}; this CPU's native kernels agree here, so this "
                    f"negative control has no difference to show")
