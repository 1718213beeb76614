"""A run stored under contract v1 still opens, and is never compared with a run of another contract.

The store keeps fingerprints as text and parses no contract, so a store written before v2 opens as it
did; what it says is which contract made its records: `NumericsContract.from_fingerprint` names v1, and
comparing one of its records with a record made under v2 is refused in one line.
"""

from __future__ import annotations

import dataclasses

import pytest

from rlkit.contract import NumericsContract
from rlkit.divergence import FingerprintMismatch, check_fingerprints
from rlkit.timeline import RunStore
from tests.timeline.fakes import initial, make_step

V1 = NumericsContract.v1().fingerprint()


def _as_v1(step: int):
    s = make_step(step)
    return (dataclasses.replace(s.summary, contract_fingerprint=V1),
            [dataclasses.replace(r, contract_fingerprint=V1) for r in s.records],
            [dataclasses.replace(r, contract_fingerprint=V1) for r in s.recomputes],
            [dataclasses.replace(v, contract_fingerprint=V1) for v in s.versions], s.syncs)


def test_a_v1_store_opens_and_names_its_contract(tmp_path):
    store = RunStore.create(tmp_path / "run", {"preset": "tiny"})
    store.commit_initial(*initial())
    summary, records, recomputes, versions, syncs = _as_v1(0)
    store.commit_step(summary, records, recomputes, versions, syncs, [])
    store.close()

    again = RunStore.open(tmp_path / "run", readonly=True)
    try:
        (step,) = again.steps()
        rec = again.records(0)[0]
        (recompute,) = again.recomputes_of(rec.record_id)
    finally:
        again.close()
    assert step.contract_fingerprint == rec.contract_fingerprint == recompute.contract_fingerprint == V1
    assert NumericsContract.from_fingerprint(rec.contract_fingerprint) == NumericsContract.v1()
    check_fingerprints(rec.contract_fingerprint, recompute.contract_fingerprint)  # same contract: compared
    with pytest.raises(FingerprintMismatch, match=r"qwen3-dense-strict-v1 v1, all strict\) != trainer contract "
                                                  r"\w+ \(qwen3-dense-strict-v6 v6, all strict\)"):
        check_fingerprints(rec.contract_fingerprint, NumericsContract.default().fingerprint())
