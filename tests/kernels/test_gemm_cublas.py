"""The cuBLAS route's guards on the CPU (kernels/gemm_cublas.py): the process setting, the canary's and
the shape check's logic with backends that do and do not depend on the batch, and that nothing routes
off a CUDA GPU. What it admits on the H200 is tests/gpu/test_gemm_cublas_gpu.py."""

import os
import subprocess
import sys

import pytest
import torch

from rlkit import NumericsContract
from rlkit.kernels import gemm, gemm_cublas

VARS = tuple(gemm_cublas.NO_WORKSPACE)


def _env_without_route_vars(**extra):
    env = {k: v for k, v in os.environ.items() if k not in VARS and k != gemm_cublas.SWITCH}
    env.update(extra)
    return env


def _child_env(env) -> dict:
    names = VARS + (gemm_cublas.SWITCH,)
    code = f"import os, rlkit.ops; print(repr({{k: os.environ.get(k) for k in {names!r}}}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr of a dict of strings


def test_importing_rlkit_sets_the_no_workspace_variables_where_unset():
    seen = _child_env(_env_without_route_vars())
    assert seen == {**gemm_cublas.NO_WORKSPACE, gemm_cublas.SWITCH: None}, seen


def test_a_users_own_workspace_setting_is_kept_and_rules_the_route_out(monkeypatch):
    seen = _child_env(_env_without_route_vars(CUBLAS_WORKSPACE_CONFIG=":4096:8"))
    assert seen["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and seen["CUBLASLT_WORKSPACE_SIZE"] == "0", seen
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "0")
    monkeypatch.delenv(gemm_cublas.SWITCH, raising=False)
    problem = gemm_cublas.environment_problem()
    assert problem is not None and ":4096:8" in problem and ":0:0" in problem, problem


def test_the_switch_leaves_the_environment_alone_and_turns_the_route_off(monkeypatch):
    seen = _child_env(_env_without_route_vars(RLKIT_GEMM_CUBLAS="0"))
    assert seen == {"CUBLAS_WORKSPACE_CONFIG": None, "CUBLASLT_WORKSPACE_SIZE": None, gemm_cublas.SWITCH: "0"}, seen
    monkeypatch.setenv(gemm_cublas.SWITCH, "0")
    assert gemm_cublas.environment_problem() == "RLKIT_GEMM_CUBLAS=0"
    monkeypatch.setenv(gemm_cublas.SWITCH, "1")
    for name, value in gemm_cublas.NO_WORKSPACE.items():
        monkeypatch.setenv(name, value)
    assert gemm_cublas.environment_problem() is None


def _fixed_tile_linear(x, w):
    """Batch-independent: every row alone (what a backend that never splits K by M gives)."""
    return torch.cat([r[None] @ w.t() for r in x]) if x.shape[0] else x @ w.t()


def _batch_dependent_linear(x, w):
    """Splits K in two for fewer than 16 rows (the way split-K heuristics choose by M)."""
    if x.shape[0] >= 16:
        return _fixed_tile_linear(x, w)
    half = w.shape[1] // 2
    return (x[:, :half] @ w[:, :half].t() + x[:, half:] @ w[:, half:].t()).to(x.dtype)


def test_the_canary_sees_a_backend_that_splits_k_by_batch_size():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 512, generator=g), torch.randn(96, 512, generator=g) * 0.05
    assert gemm_cublas.rows_split(_fixed_tile_linear, x, w) == []
    split = gemm_cublas.rows_split(_batch_dependent_linear, x, w)
    print("batch-dependent backend:", split)
    assert [m for m, _ in split] == [1, 8] and all(count > 0 for _, count in split), split


def test_the_shape_check_names_the_first_row_count_that_differs():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(300, 512, generator=g), torch.randn(96, 512, generator=g) * 0.05
    assert gemm_cublas.first_difference(_fixed_tile_linear, _fixed_tile_linear, x, w) is None
    problem = gemm_cublas.first_difference(_batch_dependent_linear, _fixed_tile_linear, x, w)
    print(problem)
    assert problem is not None and problem.startswith("M=1:") and "elements differ" in problem, problem
    late = lambda a, b: _fixed_tile_linear(a, b) + (a.shape[0] == 257)  # noqa: E731 - differs at one M only
    assert gemm_cublas.first_difference(late, _fixed_tile_linear, x, w).startswith("M=257:")


def test_nothing_routes_off_a_cuda_gpu():
    c = NumericsContract.default()
    x, w = torch.randn(8, 256).to(torch.bfloat16), (torch.randn(64, 256) * 0.05).to(torch.bfloat16)
    assert not gemm_cublas.admitted(x, w, torch.bfloat16, c, lambda a, b: a @ b.t())
    assert gemm_cublas.status("cpu") is None
    y = gemm.strict(x, w, c)
    assert torch.equal(y, gemm.reference(x, w, c)), "the CPU strict GEMM is the reference"


@pytest.mark.parametrize("name", ["qwen3-dense-strict-v1", "qwen3-dense-strict-v2"])
def test_contracts_without_one_chain_never_ask_the_route(name):
    """v1/v2 sum every GEMM in four K chunks: chunk_count is 4 for column layers too, so the route (one
    chain only) is never consulted for them."""
    assert gemm.chunk_count(NumericsContract.named(name), False) == 4
    assert gemm.chunk_count(NumericsContract.default(), False) == 1
