"""A real rlkit run -> the exchange schema (Parquet and JSONL) -> `rlkit import rlkit` -> the same records.

The run (tests/interop/conftest.py) is small and native in fp32 (where this CPU's native kernels differ, the round trip carries
differing rollout/trainer logprobs too). Every per-token list must come back bit for bit (`torch.equal` on
the fp32 tensors, sign of zero included), every record field equal (`bitwise_differences`), and the
divergence metrics the import computes must equal the run's own. A fake store with the values round trips
get wrong first (-0.0, -inf, subnormals, fp32 extremes, last-bit differences; tests/timeline/fakes.py)
goes through both spellings of the schema the same way, without a model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlkit.cli import main
from rlkit.divergence import logprob_divergence
from rlkit.interop import export_rows, read_rows, write_rows
from rlkit.timeline.records import bitwise_differences
from rlkit.timeline.store import RunStore
from tests.timeline.fakes import initial, make_step

DIVERGENCE = ("compared_tokens", "mismatch_count", "max_abs_diff", "mean_abs_diff", "k3_kl", "ratio_mean",
              "ratio_min", "ratio_max", "ratio_outside")


@pytest.fixture(scope="module")
def rlkit_run(native_run):
    return native_run[0]


def _fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_run_exported_in_the_schema_imports_to_identical_records(rlkit_run, tmp_path, suffix, capsys):
    out = tmp_path / f"records{suffix}"
    assert main(["export", str(rlkit_run), "--to", "rlkit", "--out", str(out)]) == 0
    assert main(["import", "rlkit", str(out), "--run-dir", str(tmp_path / "imported")]) == 0
    err = capsys.readouterr().err
    assert "imported 8 records of 2 steps from rlkit" in err and "not recorded: loss" in err
    with RunStore.open(rlkit_run, readonly=True) as a, RunStore.open(tmp_path / "imported", readonly=True) as b:
        assert [s.step for s in a.steps()] == [s.step for s in b.steps()] == [0, 1]
        for sa, sb in zip(a.steps(), b.steps()):
            ra, rb = a.records(sa.step), b.records(sb.step)
            assert [r.record_id for r in ra] == [r.record_id for r in rb]
            for x, y in zip(ra, rb):
                assert bitwise_differences(x, y) == [], (x.record_id, bitwise_differences(x, y))
                assert torch.equal(_fp32(x.rollout_logprobs), _fp32(y.rollout_logprobs))
                assert torch.equal(torch.tensor(x.token_ids), torch.tensor(y.token_ids))
            ca, cb = a.recomputes(sa.step), b.recomputes(sb.step)
            assert len(ca) == len(cb) == 4
            for x, y in zip(ca, cb):
                assert (x.record_id, x.weight_version, x.contract_fingerprint) == \
                       (y.record_id, y.weight_version, y.contract_fingerprint)
                assert torch.equal(_fp32(x.trainer_logprobs), _fp32(y.trainer_logprobs))
                assert torch.equal(torch.signbit(_fp32(x.trainer_logprobs)), torch.signbit(_fp32(y.trainer_logprobs)))
            # the import recomputes rlkit's divergence from the same bits: the same numbers
            assert {k: getattr(sa, k) for k in DIVERGENCE} == {k: getattr(sb, k) for k in DIVERGENCE}
        assert b.info("import")["format"] == "rlkit"


def test_schema_files_read_back_to_the_exported_rows(rlkit_run, tmp_path):
    rows = export_rows(rlkit_run)
    for suffix in (".parquet", ".jsonl"):
        back = read_rows(write_rows(rows, tmp_path / f"rows{suffix}"))
        assert [dataclasses.astuple(r) for r in back] == [dataclasses.astuple(r) for r in rows]
        for x, y in zip(rows, back):
            assert torch.equal(_fp32(x.rollout_logprobs), _fp32(y.rollout_logprobs))
            assert torch.equal(_fp32(x.trainer_logprobs), _fp32(y.trainer_logprobs))
    # the loop compares processed logprobs unless the sampling leaves the distribution alone (lab: T=1)
    assert {r.logprob_semantics for r in rows} == {"raw"}


def test_export_refuses_an_existing_file(rlkit_run, tmp_path, capsys):
    out = tmp_path / "x.parquet"
    out.write_bytes(b"keep")
    assert main(["export", str(rlkit_run), "--to", "rlkit", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists" in err[0]
    assert out.read_bytes() == b"keep"


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_special_values_round_trip_bit_for_bit(tmp_path, suffix):
    src = tmp_path / "fake"
    with RunStore.create(src, {"steps": 2}) as store:
        store.commit_initial(*initial())
        for step in range(2):
            fake = make_step(step)
            store.commit_step(fake.summary, fake.records, fake.recomputes, fake.versions, fake.syncs)
    path = write_rows(export_rows(src), tmp_path / f"rows{suffix}")
    assert main(["import", "rlkit", str(path), "--run-dir", str(tmp_path / "back")]) == 0
    with RunStore.open(src, readonly=True) as a, RunStore.open(tmp_path / "back", readonly=True) as b:
        for step in range(2):
            for x, y in zip(a.records(step), b.records(step), strict=True):
                assert bitwise_differences(x, y) == []
            for x, y in zip(a.recomputes(step), b.recomputes(step), strict=True):
                tx, ty = _fp32(x.trainer_logprobs), _fp32(y.trainer_logprobs)
                assert torch.equal(tx, ty) and torch.equal(torch.signbit(tx), torch.signbit(ty))
            # the fake summary's numbers are made up: the import's are computed from the records
            expected = logprob_divergence([_fp32(r.rollout_logprobs) for r in a.records(step)],
                                          [_fp32(c.trainer_logprobs) for c in a.recomputes(step)])
            assert expected.mismatch_count > 0
            assert {k: getattr(b.steps()[step], k) for k in DIVERGENCE} == expected.to_dict()
