"""The numerics contract as data: frozen, versioned, fingerprinted, validated, JSON round-trippable."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit import ContractError, NumericsContract, OPS
from rlkit.divergence import FingerprintMismatch, check_fingerprints
from rlkit.contract import (_SECTIONS, V1_FIXED, AttentionSpec, GemmSpec, GpuSpec, LogprobSpec, OpPaths,
                            RmsNormSpec)

ROOT = Path(__file__).resolve().parents[1]


def test_default_is_named_versioned_and_all_strict():
    c = NumericsContract.default()
    assert c.name == "qwen3-dense-strict-v6"
    assert c.version == 6
    assert c.all_strict
    assert all(c.path(op) == "strict" for op in OPS)


def test_v1_keeps_its_fingerprints_and_json():
    """v2 removed fields no code read and added logprob.top_p_scan_block; the bits are v1's, so v1 stays
    selectable and serializes, and fingerprints, exactly as the runs recorded under it (these hex
    strings are what v1 wrote: docs/VALIDATION.md's run carries b8dbda3e304b4df3)."""
    v1 = NumericsContract.named("qwen3-dense-strict-v1")
    assert v1 == NumericsContract.v1() and v1.version == 1
    assert v1.fingerprint() == "b8dbda3e304b4df3"
    assert v1.with_every_op("native").fingerprint() == "f616f4c046c67768"
    assert v1.with_ops(attention="native").fingerprint() == "8007695534cdf5ea"
    data = json.loads(v1.to_json())
    for section, fields in V1_FIXED.items():
        assert {k: data[section][k] for k in fields} == fields
    assert "top_p_scan_block" not in data["logprob"] and "gpu" not in data
    back = NumericsContract.from_json(v1.to_json())
    assert back == v1 and back.fingerprint() == v1.fingerprint()
    # the same kernel parameters as v2's, under another name, version and fingerprint
    v2 = NumericsContract.named("qwen3-dense-strict-v2")
    assert (v1.gemm, v1.attention, v1.logprob, v1.rms_norm) == (v2.gemm, v2.attention, v2.logprob, v2.rms_norm)
    assert v2.fingerprint() != v1.fingerprint()


def test_v2_keeps_its_fingerprint_and_has_no_column_chunks():
    """v3 added gemm.column_k_chunks; v2 neither writes it nor accepts another value than "the same as
    k_chunks", so its JSON and fingerprint are what v2 runs recorded (56da574454d87eba, all strict)."""
    v2 = NumericsContract.named("qwen3-dense-strict-v2")
    assert v2.version == 2 and v2.fingerprint() == "56da574454d87eba"
    assert "column_k_chunks" not in json.loads(v2.to_json())["gemm"]
    assert v2.gemm.column_k_chunks is None and v2.gemm.k_chunks == 4  # every GEMM: 4 chunks
    back = NumericsContract.from_json(v2.to_json())
    assert back == v2 and back.fingerprint() == v2.fingerprint()
    with pytest.raises(ContractError, match="version 2 fixes it"):
        v2.replace(gemm=GemmSpec(column_k_chunks=1, chunk_merge="pairwise_tree"))


def test_v3_sums_k_in_one_chain_except_where_tensor_parallelism_splits_it():
    v3 = NumericsContract.named("qwen3-dense-strict-v3")
    assert v3.gemm.k_chunks == 4 and v3.gemm.column_k_chunks == 1
    assert json.loads(v3.to_json())["gemm"]["column_k_chunks"] == 1
    assert v3.fingerprint() == "4ad5da738c5d861c"  # what v3 runs recorded (the golden run of 2026-12-01)
    assert len({NumericsContract.named(n).fingerprint() for n in
                ("qwen3-dense-strict-v1", "qwen3-dense-strict-v2", "qwen3-dense-strict-v3",
                 "qwen3-dense-strict-v4", "qwen3-dense-strict-v5", "qwen3-dense-strict-v6")}) == 6


def test_v4_folds_split_states_in_order_and_sums_p_on_the_matrix_unit():
    """v4 adds attention.split_merge and attention.row_sum; v3 neither writes them nor accepts other
    values than what its kernels did (the pairwise tree, the tile's row reduction)."""
    v4, v3 = NumericsContract.named("qwen3-dense-strict-v4"), NumericsContract.named("qwen3-dense-strict-v3")
    assert (v4.attention.split_merge, v4.attention.row_sum) == ("sequential", "tensor_core")
    assert (v3.attention.split_merge, v3.attention.row_sum) == ("pairwise_tree", "tile_reduce")
    assert "split_merge" not in json.loads(v3.to_json())["attention"]
    assert json.loads(v4.to_json())["attention"]["split_merge"] == "sequential"
    assert (v4.gemm, v4.logprob, v4.rms_norm, v4.gpu) == (v3.gemm, v3.logprob, v3.rms_norm, v3.gpu)
    with pytest.raises(ContractError, match="version 3 fixes it"):
        v3.replace(attention=AttentionSpec(split_merge="pairwise_tree"))  # row_sum defaults to v4's
    back = NumericsContract.from_json(v3.to_json())
    assert back == v3 and back.fingerprint() == v3.fingerprint()
    assert v4.fingerprint() == "da12e5b5407c47a5"  # what v4 runs recorded (split 512)


def test_v5_merges_gemm_chunks_in_order_and_keeps_v4_elsewhere():
    """v5 adds gemm.chunk_merge ("sequential"); v4 neither writes it nor accepts another value than the
    pairwise tree its kernels ran, so v4 stores read back with their fingerprints."""
    v5, v4 = NumericsContract.named("qwen3-dense-strict-v5"), NumericsContract.named("qwen3-dense-strict-v4")
    assert v5.gemm.chunk_merge == "sequential" and v4.gemm.chunk_merge == "pairwise_tree"
    assert "chunk_merge" not in json.loads(v4.to_json())["gemm"]
    assert json.loads(v5.to_json())["gemm"]["chunk_merge"] == "sequential"
    assert (v5.attention, v5.logprob, v5.rms_norm, v5.gpu) == (v4.attention, v4.logprob, v4.rms_norm, v4.gpu)
    assert dataclasses.replace(v5.gemm, chunk_merge="pairwise_tree") == v4.gemm
    with pytest.raises(ContractError, match="version 4 fixes it"):
        v4.replace(gemm=GemmSpec(chunk_merge="sequential"))  # v5's merge
    with pytest.raises(ContractError, match="gemm.chunk_merge"):
        GemmSpec(chunk_merge="ring")
    for c in (v4, v5, v5.with_ops(linear="native")):
        back = NumericsContract.from_json(c.to_json())
        assert back == c and back.fingerprint() == c.fingerprint()
    assert v5.fingerprint() == "72aaa5a31841ace5"  # what v5 runs recorded


def test_v6_chains_the_row_parallel_chunks_and_keeps_v5_elsewhere():
    """v6 changes one value: gemm.chunk_merge = "chained" (v5's field, so v5 stores read back unchanged);
    no earlier version accepts the chained merge, and v6 may still name the others. v6 is the default; v5
    keeps its fingerprint."""
    v6, v5 = NumericsContract.named("qwen3-dense-strict-v6"), NumericsContract.named("qwen3-dense-strict-v5")
    assert NumericsContract() == NumericsContract.default() == v6
    assert v6.fingerprint() == "6d1e0e7d59ba61fc" and v5.fingerprint() == "72aaa5a31841ace5"
    assert v6.gemm.chunk_merge == "chained" and v5.gemm.chunk_merge == "sequential"
    assert dataclasses.replace(v6.gemm, chunk_merge="sequential") == v5.gemm
    assert (v6.attention, v6.logprob, v6.rms_norm, v6.gpu) == (v5.attention, v5.logprob, v5.rms_norm, v5.gpu)
    assert json.loads(v6.to_json())["gemm"]["chunk_merge"] == "chained"
    assert v6.fingerprint() != v5.fingerprint()
    with pytest.raises(ContractError, match="the chained merge is version 6's; this is version 5"):
        v5.replace(gemm=GemmSpec(chunk_merge="chained"))
    v6.replace(gemm=GemmSpec())  # accepted: a v6 variant with v5's merge and its own fingerprint
    for c in (v6, v6.with_ops(all_reduce="native")):
        back = NumericsContract.from_json(c.to_json())
        assert back == c and back.fingerprint() == c.fingerprint()


def test_from_fingerprint_finds_released_contracts_only():
    for c in (NumericsContract.v1(), NumericsContract.default().with_ops(logprob="native"), NumericsContract.native(),
              NumericsContract.named("qwen3-dense-strict-v2").with_ops(attention="native")):
        assert NumericsContract.from_fingerprint(c.fingerprint()) == c
    odd = NumericsContract.default().replace(gemm=GemmSpec(k_chunks=8))
    assert NumericsContract.from_fingerprint(odd.fingerprint()) is None


def _reads(source: str, section: str, name: str) -> bool:
    """`contract.<section>.<name>` or, in a function that binds `spec = contract.<section>`, `spec.<name>`."""
    if re.search(rf"\.{section}\.{name}\b", source):
        return True
    return bool(re.search(rf"spec = contract\.{section}\b", source) and re.search(rf"\bspec\.{name}\b", source))


def test_every_contract_field_has_a_reader():
    """Each kernel parameter is read by the kernels (kernels/), each op path by the dispatch (rlkit/ops.py):
    a field nothing reads cannot be honoured, so it is not in the contract."""
    kernels = "\n".join(p.read_text() for p in sorted((ROOT / "kernels").glob("*.py")))
    ops_src = (ROOT / "rlkit" / "ops.py").read_text()
    for section, kind in _SECTIONS.items():
        for f in dataclasses.fields(kind):
            if section == "paths":
                assert f'_strict("{f.name}")' in ops_src, f"paths.{f.name}: rlkit/ops.py never asks for it"
            else:
                assert _reads(kernels, section, f.name), f"{section}.{f.name}: no kernel reads it"


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
    (lambda: GemmSpec(column_k_chunks=6), "gemm.column_k_chunks", "power of two"),
    (lambda: GemmSpec(column_k_chunks=0), "gemm.column_k_chunks", "positive"),
    (lambda: GemmSpec(row_tile=0), "gemm.row_tile", "positive"),
    (lambda: LogprobSpec(vocab_chunk=0), "logprob.vocab_chunk", "positive"),
    (lambda: GemmSpec(k_tile=48), "gemm.k_tile", "power of two"),
    (lambda: GemmSpec(k_tile=8), "gemm.k_tile", ">= 16"),
    (lambda: GemmSpec(k_tile=0), "gemm.k_tile", "positive"),
    (lambda: LogprobSpec(row_block=0), "logprob.row_block", "positive"),
    (lambda: LogprobSpec(top_p_scan_block=1000), "logprob.top_p_scan_block", "power of two"),
    (lambda: LogprobSpec(top_p_scan_block=-2), "logprob.top_p_scan_block", "positive"),
    (lambda: RmsNormSpec(weight_multiply="bfloat16"), "rms_norm.weight_multiply", "model_dtype | float32"),
    (lambda: GpuSpec(fp_fusion=True), "gpu.fp_fusion", "False"),
    (lambda: NumericsContract(name=""), "name", "non-empty"),
    (lambda: NumericsContract(version=7), "version", "1 | 2 | 3 | 4 | 5 | 6"),
    (lambda: NumericsContract.from_json('{"version": 7}'), "version", "1 | 2 | 3 | 4 | 5 | 6"),
    (lambda: GemmSpec(chunk_merge="ring"), "gemm.chunk_merge", "chained | sequential | pairwise_tree"),
    (lambda: AttentionSpec(split_merge="stack"), "attention.split_merge", "sequential | pairwise_tree"),
    (lambda: AttentionSpec(row_sum="warp"), "attention.row_sum", "tensor_core | tile_reduce"),
    (lambda: NumericsContract.from_json('{"version": 2, "gemm": {"column_k_chunks": 1}}'),
     "gemm.column_k_chunks", "k_chunks"),
    (lambda: NumericsContract(version=0), "version", "positive"),
    (lambda: NumericsContract(gemm="fast"), "gemm", "GemmSpec"),
    (lambda: NumericsContract.named("qwen3-dense-fast"), "name", "qwen3-dense-strict-v6 | qwen3-dense-strict-v5"),
    # version 1 fixes the scan block it never wrote, and its written-but-unread fields to their one value
    (lambda: NumericsContract.v1().replace(logprob=LogprobSpec(top_p_scan_block=512)),
     "logprob.top_p_scan_block", "version 1 fixes it"),
    (lambda: NumericsContract.from_json('{"version": 1, "gemm": {"accumulate": "bfloat16"}}'),
     "gemm.accumulate", "float32"),
    (lambda: NumericsContract.from_json('{"version": 1, "primitives": {"exp": "exp2"}}'),
     "primitives.exp", "'exp'"),
    # version 2 no longer has them: a v2 contract naming one is refused
    (lambda: NumericsContract.from_json('{"version": 2, "gemm": {"combine": "pairwise_tree"}}'),
     "gemm.combine", "k_chunks"),
    (lambda: NumericsContract.from_json('{"version": 2, "primitives": {}}'), "primitives", "attention"),
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


@pytest.mark.parametrize("op", OPS)
def test_every_op_path_refuses_other_values(op):
    with pytest.raises(ContractError) as err:
        OpPaths(**{op: "fast"})
    assert err.value.field_name == f"paths.{op}"


def test_records_of_different_contracts_are_never_compared():
    """A store written under v1 holds v1 fingerprints: comparing its records with a default run's is refused
    with one line naming both contracts (an unknown fingerprint is named as it is)."""
    v1, default = NumericsContract.v1(), NumericsContract.default()
    check_fingerprints(v1.fingerprint(), v1.fingerprint())
    with pytest.raises(FingerprintMismatch) as err:
        check_fingerprints(v1.fingerprint(), default.with_ops(attention="native").fingerprint())
    msg = str(err.value)
    assert "\n" not in msg and "refusing to compare" in msg
    assert "b8dbda3e304b4df3 (qwen3-dense-strict-v1 v1, all strict)" in msg
    assert f"{default.with_ops(attention='native').fingerprint()} (qwen3-dense-strict-v6 v6, native attention)" in msg
    with pytest.raises(FingerprintMismatch, match="rollout contract 0123456789abcdef != trainer"):
        check_fingerprints("0123456789abcdef", default.fingerprint())


def test_numerics_table_points_at_code_and_tests_that_exist():
    """docs/NUMERICS.md: every contract field it names exists, every `file` `function` it names is
    defined in that file, every `tests/...::test` exists."""
    text = (ROOT / "docs" / "NUMERICS.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| source")]
    assert len(rows) >= 9
    fields = {f"{section}.{f.name}" for section, kind in _SECTIONS.items() for f in dataclasses.fields(kind)}
    checked = 0
    for line in text.splitlines():
        current = None
        for token in re.findall(r"`([^`]+)`", line):
            if "::" in token and token.startswith("tests/"):
                path, name = token.split("::")
                assert re.search(rf"^def {name}\b", (ROOT / path).read_text(), re.M), token
                checked += 1
            elif token.endswith(".py"):
                assert (ROOT / token).is_file(), token
                current = ROOT / token
            elif re.fullmatch(r"[a-z_]+\.[a-z_<>]+", token) and token.split(".")[0] in _SECTIONS:
                assert token in fields or token == "paths.<op>", f"{token}: no such contract field"
                checked += 1
            elif current is not None and re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*(\(.*\))?", token):
                name = token.split("(")[0]
                assert re.search(rf"^\s*(def|class) {name}\b|^{name} = ", current.read_text(), re.M), \
                    f"{token} is not defined in {current.relative_to(ROOT)}"
                checked += 1
    assert checked > 60
