"""Strict SwiGLU and RoPE: elementwise ops whose only contract is where roundings sit and which
primitives run; tests check closeness, invariance to batch and position-in-tensor, and tables."""

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal, compare
from rlkit.kernels import rope, swiglu
from rlkit.kernels.errors import OpInputError
from tests.kernels.tolerances import REL_TOL, rel_err
from tests.negative import require_native_difference

C = NumericsContract.default()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_close_and_invariant(dtype):
    g = (3 * torch.randn(50, 384)).to(dtype)
    u = torch.randn(50, 384).to(dtype)
    out = swiglu.reference(g, u, C)
    ref = g.double() * torch.sigmoid(g.double()) * u.double()
    assert rel_err(out, ref) < REL_TOL[dtype]
    for lo, hi in [(0, 1), (3, 4), (17, 18), (5, 37)]:
        assert_bitwise_equal(swiglu.reference(g[lo:hi].clone(), u[lo:hi].clone(), C), out[lo:hi], f"rows {lo}:{hi}")


def test_swiglu_native_depends_on_position_in_tensor():
    """Negative control: torch's silu uses another code path for the tail of a vector loop, so the
    same value can round differently depending on where it sits (measured on this CPU's AVX-512)."""
    g = 10 * torch.randn(4099)
    u = torch.ones(4099)
    whole = swiglu.native(g, u)
    singles = torch.cat([swiglu.native(g[i : i + 1].clone(), u[i : i + 1]) for i in range(4099)])
    report = compare(whole, singles, "native silu whole vs one element at a time")
    require_native_difference(report.differing, str(report))
    strict_singles = torch.cat([swiglu.reference(g[i : i + 1].clone(), u[i : i + 1], C) for i in range(4099)])
    assert_bitwise_equal(swiglu.reference(g, u, C), strict_singles, "strict whole vs single elements")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_close_to_fp64(dtype):
    x = torch.randn(40, 4, 64).to(dtype)
    pos = torch.randint(0, 5000, (40,))
    out = rope.reference(x, pos, 1e6, C)
    inv = 1e6 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    ang = pos.double()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)[:, None, :]
    xd = x.double()
    ref = xd * ang.cos() + torch.cat([-xd[..., 32:], xd[..., :32]], -1) * ang.sin()
    assert rel_err(out, ref) < REL_TOL[dtype]


def test_rope_depends_only_on_value_and_position():
    """The same (row, position) gives the same bits whatever else is in the call and however long the
    cached table has grown (tables are built in fixed 1024-position blocks)."""
    x = torch.randn(30, 2, 32).bfloat16()
    pos = torch.arange(1000, 1030)
    whole = rope.reference(x, pos, 1e6, C)
    rope.tables(50_000, 32, 1e6, x.device)  # grow the table
    assert_bitwise_equal(rope.reference(x[7:8], pos[7:8], 1e6, C), whole[7:8], "one row after the table grew")
    shuffled = torch.randperm(30)
    assert_bitwise_equal(rope.reference(x[shuffled], pos[shuffled], 1e6, C), whole[shuffled], "shuffled batch")


def test_rope_tables_are_block_stable():
    c1, s1 = rope._tables_cpu(1, 32, 1e6)
    c3, s3 = rope._tables_cpu(3, 32, 1e6)
    assert_bitwise_equal(c3[:1024], c1, "cos table prefix")
    assert_bitwise_equal(s3[:1024], s1, "sin table prefix")


def test_bad_inputs():
    with pytest.raises(OpInputError, match=r"rlkit.ops.swiglu: gate has shape \(2, 3\) and up \(2, 4\)"):
        swiglu.reference(torch.randn(2, 3), torch.randn(2, 4), C)
    with pytest.raises(OpInputError, match=r"rlkit.ops.rope: positions has shape \(3,\); expected \[2\]"):
        rope.reference(torch.randn(2, 1, 8), torch.arange(3), 1e6, C)
    with pytest.raises(OpInputError, match="expected \\[tokens, heads, head_dim\\]"):
        rope.reference(torch.randn(2, 8), torch.arange(2), 1e6, C)


def test_native_on_the_cpu_is_hf_eager():
    """The native control on the CPU stays HF's eager ops, bit for bit (the fused kernels are for CUDA
    tensors only); a bound on the positions changes nothing there."""
    g, u = 3 * torch.randn(7, 96).bfloat16(), torch.randn(7, 96).bfloat16()
    assert_bitwise_equal(swiglu.native(g, u), torch.nn.functional.silu(g) * u, "swiglu native on the CPU")
    x, pos = torch.randn(6, 4, 64).bfloat16(), torch.tensor([0, 5, 17, 4095, 4096, 30_000])
    eager = rope.native_eager(x, pos, 1e6)
    assert_bitwise_equal(rope.native(x, pos, 1e6), eager, "rope native on the CPU")
    assert_bitwise_equal(rope.native(x, pos, 1e6, max_position=40_960), eager, "with a position bound")
