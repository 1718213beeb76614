"""rlkit.ops: one dispatch point per op, following a scoped contract (no global state in torch)."""

import threading

import pytest
import torch

from rlkit import NumericsContract, ops
from rlkit.bitwise import assert_bitwise_equal
from rlkit.kernels import gemm, rms_norm


def test_use_contract_is_scoped_and_restores_on_error():
    default = ops.current_contract()
    native = NumericsContract.native()
    with ops.use_contract(native):
        assert ops.current_contract() is native
        with ops.use_contract(NumericsContract.default().with_ops(linear="native")) as inner:
            assert ops.current_contract() is inner
        assert ops.current_contract() is native
    assert ops.current_contract() is default
    with pytest.raises(RuntimeError):
        with ops.use_contract(native):
            raise RuntimeError("boom")
    assert ops.current_contract() is default
    with pytest.raises(TypeError, match="NumericsContract"):
        with ops.use_contract("strict"):
            pass


def test_contract_is_per_thread():
    seen = {}

    def worker():
        seen["worker"] = ops.current_contract().path("linear")

    with ops.use_contract(NumericsContract.native()):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        seen["main"] = ops.current_contract().path("linear")
    assert seen == {"worker": "strict", "main": "native"}


def test_dispatch_follows_each_op_path():
    x = torch.randn(33, 256)
    w = torch.randn(64, 256)
    nw = torch.randn(256)
    with ops.use_contract(NumericsContract.default().with_ops(linear="native")):
        assert_bitwise_equal(ops.linear(x, w), gemm.native(x, w), "native linear")
        assert_bitwise_equal(ops.rms_norm(x, nw, 1e-6), rms_norm.reference(x, nw, 1e-6, NumericsContract.default()),
                             "strict rms_norm")
    assert_bitwise_equal(ops.linear(x, w), gemm.reference(x, w, NumericsContract.default()), "strict linear")


def test_bad_input_names_the_op():
    with pytest.raises(ops.OpInputError, match=r"^rlkit.ops.linear: "):
        ops.linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(ops.OpInputError, match=r"^rlkit.ops.rms_norm: x has dtype torch.int64"):
        ops.rms_norm(torch.ones(2, 8, dtype=torch.int64), torch.ones(8), 1e-6)
