"""Strict kernels, one file per op: the torch reference that *is* the contract (batch-invariant by
construction) and, where written, the Triton kernel and its launcher.

Installed as `rlkit.kernels` (never as a top-level `kernels`). Import the op modules directly, e.g.
`from rlkit.kernels import gemm; gemm.reference(x, w, contract)`; `rlkit.ops` is the dispatch point that
picks strict or native per the active contract.
"""
