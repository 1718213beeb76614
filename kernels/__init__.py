"""Strict kernels, one file per op: the torch reference that *is* the contract (batch-invariant by
construction) and, where written, the Triton kernel and its launcher.

Installed as `rlkit.kernels` (never as a top-level `kernels`). Import the op modules directly, e.g.
`from rlkit.kernels import gemm; gemm.reference(x, w, contract)`; `rlkit.ops` is the dispatch point that
picks strict or native per the active contract.

The strict GEMM's cuBLAS route (kernels/gemm_cublas.py) needs cuBLAS without a workspace in this
process, set before the process's first cuBLAS call: importing this package sets the two variables where
they are unset (nothing when RLKIT_GEMM_CUBLAS=0).
"""

from rlkit.kernels.gemm_cublas import prepare_process as _prepare_process

_prepare_process()
