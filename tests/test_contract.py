"""The numerics contract as data: frozen, versioned, fingerprinted, validated, JSON round-trippable."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from rlkit import ContractError, NumericsContract, OPS
from rlkit.contract import AttentionSpec, GemmSpec, LogprobSpec


def test_default_is_named_versioned_and_all_strict():
    c = NumericsContract.default()
    assert c.name == "qwen3-dense-strict-v1"
    assert c.version == 1
    assert c.all_strict
    assert all(c.path(op) == "strict" for op in OPS)


def test_fingerprint_is_stable_across_processes():
    code = "import rlkit; print(rlkit.NumericsContract.default().fingerprint())"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] == NumericsContract.default().fingerprint() + "\n"
    assert len(runs[0].strip()) == 16


def test_with_ops_returns_a_new_contract_with_a_new_fingerprint():
    c = NumericsContract.default()
    n = c.with_ops(attention="native")
    assert n is not c and c.paths.attention == "strict" and n.paths.attention == "native"
    assert n.fingerprint() != c.fingerprint()
    assert n.with_ops(attention="strict").fingerprint() == c.fingerprint()
    assert NumericsContract.native().path("linear") == "native"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"  # type: ignore[misc]


def test_json_round_trip_keeps_every_field():
    c = NumericsContract.default().with_ops(logprob="native").replace(
        attention=AttentionSpec(split_size=128, block_size=16), gemm=GemmSpec(k_chunks=8))
    back = NumericsContract.from_json(c.to_json())
    assert back == c and back.fingerprint() == c.fingerprint()


@pytest.mark.parametrize("build, field_name, allowed", [
    (lambda: NumericsContract.default().with_ops(attention="fast"), "paths.attention", "strict | native"),
    (lambda: NumericsContract.default().with_ops(conv="strict"), "paths", "rms_norm"),
    (lambda: AttentionSpec(split_size=100, block_size=32), "attention.split_size", "multiple"),
    (lambda: AttentionSpec(split_size=0), "attention.split_size", "positive"),
    (lambda: AttentionSpec(block_size=-4), "attention.block_size", "positive"),
    (lambda: GemmSpec(k_chunks=3), "gemm.k_chunks", "power of two"),
    (lambda: GemmSpec(row_tile=0), "gemm.row_tile", "positive"),
    (lambda: LogprobSpec(vocab_chunk=0), "logprob.vocab_chunk", "positive"),
    (lambda: GemmSpec(accumulate="bfloat16"), "gemm.accumulate", "float32"),
    (lambda: NumericsContract.from_json('{"gemm": {"k_chunks": 4, "warp": 2}}'), "gemm.warp", "k_chunks"),
    (lambda: NumericsContract.from_json('{"colour": 1}'), "colour", "attention"),
    (lambda: NumericsContract.from_json("not json"), "json", "valid JSON"),
    (lambda: NumericsContract.parse_ops("attention"), "ops", "op=path"),
    (lambda: NumericsContract.parse_ops("softmax=native"), "ops", "attention"),
])
def test_invalid_contracts_name_the_field_and_the_allowed_values(build, field_name, allowed):
    with pytest.raises(ContractError) as err:
        build()
    assert err.value.field_name == field_name
    assert allowed in str(err.value)


def test_parse_ops_reads_cli_values():
    assert NumericsContract.parse_ops("attention=native, linear=strict") == {
        "attention": "native", "linear": "strict"}
    assert NumericsContract.parse_ops("") == {}
