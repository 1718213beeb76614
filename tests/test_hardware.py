"""The CPU description and the dtype a run that did not name one computes in."""

import pytest

from rlkit import hardware
from rlkit.config import RunConfig


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "fma"}, "float32"),                                   # AMD EPYC of this machine kind
    ({"avx2", "avx512f", "avx512_vnni"}, "float32"),               # AVX-512 without a bf16 unit
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "avx512f", "amx_tile", "amx_bf16"}, "bfloat16"),
])
def test_cpu_dtype_follows_the_native_bf16_units(monkeypatch, flags, expected):
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("test CPU", frozenset(flags), "GenuineIntel"))
    dtype, why = hardware.default_dtype("cpu")
    assert dtype == expected, why
    cfg, reason = RunConfig().with_resolved_dtype()
    assert RunConfig().dtype == "auto" and cfg.dtype == expected and reason == f"auto: {why}"


def test_gpus_get_bf16_and_an_explicit_dtype_is_kept():
    assert hardware.default_dtype("cuda")[0] == "bfloat16"
    assert hardware.default_dtype("cuda:1")[0] == "bfloat16"
    cfg, reason = RunConfig(dtype="float32").with_resolved_dtype()
    assert cfg.dtype == "float32" and reason == "float32 was asked for"


def test_describe_names_this_cpu():
    d = hardware.describe()
    assert d["cpu"] and d["torch_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "NO AVX")
    assert d["native_bf16"] == hardware.has_native_bf16()
    assert d["cpu"] in hardware.summary()
