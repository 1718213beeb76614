"""The strict GEMM's cuBLAS route on the GPU (kernels/gemm_cublas.py): admitted on the H200, its products
the Triton one-chain kernel's bits at every row count and shape it runs, TP column shards equal to the
whole, refused by its canary where cuBLAS keeps torch's default workspace (negative control), and
captured CUDA graphs replaying it bit for bit."""

import os
import subprocess
import sys

import pytest
import torch

from rlkit import NumericsContract, ops
from rlkit.bitwise import assert_bitwise_equal
from rlkit.kernels import gemm, gemm_cublas

pytestmark = pytest.mark.gpu
C = NumericsContract.default()
DEV = "cuda"
M_SWEEP = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257,
           383, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 3000, 4095, 4096]
COLUMN_SHAPES = {  # (K, N) of the Qwen3 column layers: q/k/v, gate/up, lm_head
    "0.6b.qkv": (1024, 4096), "0.6b.gate_up": (1024, 6144), "1.7b.qkv": (2048, 4096),
    "1.7b.gate_up": (2048, 12288), "8b.qkv": (4096, 6144), "8b.gate_up": (4096, 24576),
    "0.6b.lm_head": (1024, 151936), "8b.lm_head": (4096, 151936),
}


def randn(*shape, scale=1.0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEV) * scale).to(torch.bfloat16)


def _cublas_ran(k, n, out="bfloat16") -> bool:
    state = gemm_cublas.status(DEV)
    return state is not None and state.on_cublas(k, n, out=out)


def test_the_route_is_admitted_here():
    if os.environ.get(gemm_cublas.SWITCH) == "0":
        pytest.fail("RLKIT_GEMM_CUBLAS=0 in the test environment: the route under test is off")
    x, w = randn(8, 1024, seed=1), randn(4096, 1024, scale=0.02, seed=2)
    gemm.strict(x, w, C)
    state = ops.gemm_route(DEV)
    print(state.summary())
    assert state.admitted, state.reason
    assert _cublas_ran(1024, 4096), state.summary()


@pytest.mark.parametrize("label", list(COLUMN_SHAPES))
def test_routed_products_are_the_triton_kernels_bits_at_every_row_count(label):
    k, n = COLUMN_SHAPES[label]
    big = 4096 if n < 100_000 else 1025
    x, w = randn(big, k, seed=3), randn(n, k, scale=0.02, seed=4)
    whole = gemm.strict(x, w, C)
    assert _cublas_ran(k, n), gemm_cublas.status(DEV).summary()
    for m in [m for m in M_SWEEP if m <= big]:
        routed = gemm.strict(x[:m], w, C)
        assert_bitwise_equal(routed, gemm.triton_partial(x[:m], w, C, 1, torch.bfloat16),
                             f"{label}: cuBLAS route vs Triton at M={m}")
        assert_bitwise_equal(routed, whole[:m], f"{label}: first {m} rows vs inside {big}")
    if "lm_head" in label:  # fp32 logits, what the strict logprob reads
        for m in (1, 7, 64, 65, 1000):
            assert_bitwise_equal(gemm.strict(x[:m], w, C, torch.float32),
                                 gemm.triton_partial(x[:m], w, C, 1, torch.float32), f"{label} fp32 M={m}")
        assert _cublas_ran(k, n, "float32"), gemm_cublas.status(DEV).summary()


@pytest.mark.parametrize("tp", [2, 4])
def test_column_shards_on_the_route_equal_the_whole(tp):
    k, n = COLUMN_SHAPES["8b.qkv"]
    x, w = randn(700, k, seed=5), randn(n, k, scale=0.02, seed=6)
    whole = gemm.strict(x, w, C)
    shard = n // tp
    for r in range(tp):
        part = w[r * shard : (r + 1) * shard]
        assert_bitwise_equal(gemm.strict(x, part, C), whole[:, r * shard : (r + 1) * shard], f"TP{tp} shard {r}")


def test_logprob_on_the_route_equals_the_triton_logits_path():
    from rlkit.kernels import logprob

    k, n = COLUMN_SHAPES["0.6b.lm_head"]
    h, w = randn(300, k, seed=7), randn(n, k, scale=0.02, seed=8)
    ids = torch.randint(0, n, (300,), device=DEV, generator=torch.Generator(device=DEV).manual_seed(9))
    via_route = logprob.triton_logprob(h, w, ids, C)
    via_triton = logprob.triton_from_logits(gemm.triton_partial(h, w, C, 1, torch.float32), ids, C)
    assert_bitwise_equal(via_route, via_triton, "logprob: routed lm_head vs Triton lm_head")


def test_a_graph_captured_on_the_route_replays_its_bits():
    k, n = COLUMN_SHAPES["1.7b.qkv"]
    x, w = randn(64, k, seed=10), randn(n, k, scale=0.02, seed=11)
    eager = gemm.strict(x, w, C)  # the shape's check runs here, outside the capture
    assert _cublas_ran(k, n)
    out = torch.empty_like(eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out.copy_(gemm.strict(x, w, C))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(gemm.strict(x, w, C))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, eager, "graph replay vs eager on the route")


CANARY_AT_DEFAULTS = """
import warnings
import torch
from rlkit.kernels import gemm_cublas
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    for k, n in gemm_cublas.CANARY_SHAPES:
        g = torch.Generator(device="cuda")
        x = torch.randn(1024, k, generator=g.manual_seed(1), device="cuda").to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g.manual_seed(2), device="cuda") * 0.02).to(torch.bfloat16)
        print("SPLIT", k, n, gemm_cublas.rows_split(torch.nn.functional.linear, x, w))
    state = gemm_cublas.device_state(torch.device("cuda"))
print("ADMITTED", state.admitted, "|", state.reason)
"""


@pytest.mark.parametrize("setting", ["switch_off", "default_workspace"])
def test_the_canary_refuses_the_route_at_torchs_default_workspace(setting):
    """Negative control: in a process whose cuBLAS keeps a workspace, the canary's own check
    (`rows_split`) finds rows that split K at the canary shapes (printed), and the route stays off.
    `switch_off`: RLKIT_GEMM_CUBLAS=0 (rlkit sets nothing: torch's defaults); `default_workspace`: the
    variables set to torch's Hopper default size (32 MiB) by hand, which the environment check names."""
    env = {k: v for k, v in os.environ.items() if k not in gemm_cublas.NO_WORKSPACE}
    if setting == "switch_off":
        env[gemm_cublas.SWITCH] = "0"
    else:
        env.pop(gemm_cublas.SWITCH, None)
        env.update(CUBLAS_WORKSPACE_CONFIG=":4096:8", CUBLASLT_WORKSPACE_SIZE="1024")
    out = subprocess.run([sys.executable, "-c", CANARY_AT_DEFAULTS], env=env, capture_output=True, text=True)
    print(out.stdout, out.stderr[-1500:])
    assert out.returncode == 0, out.stderr[-2000:]
    assert any(line.startswith("SPLIT") and not line.endswith("[]") for line in out.stdout.splitlines()), \
        "cuBLAS did not split K at any canary shape at the defaults: the canary has nothing to see"
    assert "ADMITTED False" in out.stdout

