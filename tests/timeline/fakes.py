"""Deterministic fake run content for the timeline tests, and bitwise comparisons of records.

`make_step(step)` builds everything one RL step commits (summary, records, recomputes, the version its
update publishes and the syncs of that version), from a seed derived from the step number only, so a test
process can rebuild exactly what a killed writer subprocess was writing and compare the store against it.
Logprobs include the values that round trips get wrong first: -0.0, -inf, subnormals, the fp32 extremes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlkit.contract import NumericsContract
from rlkit.timeline import Recompute, RolloutRecord, StepSummary, SyncEvent, WeightVersion
from rlkit.timeline.records import bitwise_differences

FP = NumericsContract.default().fingerprint()
ENGINES = ("engine-0", "engine-1")
SPECIAL = np.array([-0.0, 0.0, -np.inf, np.finfo(np.float32).tiny / 8, -np.finfo(np.float32).max,
                    np.float32(1e-45), -1e-30], dtype=np.float32)


@dataclass
class FakeStep:
    summary: StepSummary
    records: list[RolloutRecord]
    recomputes: list[Recompute]
    versions: list[WeightVersion]
    syncs: list[SyncEvent]


def checksum(version: int) -> str:
    return f"{version * 2654435761 % 2**64:016x}"


def initial() -> tuple[list[WeightVersion], list[SyncEvent]]:
    v0 = WeightVersion(0, -1, checksum(0), FP, 1000.0)
    return [v0], [SyncEvent(e, 0, checksum(0), checksum(0), 1000.0, 1000.5) for e in ENGINES]


def make_step(step: int, n_records: int = 8, max_tokens: int = 48) -> FakeStep:
    rng = np.random.default_rng(1234 + step)
    records, recomputes = [], []
    for i in range(n_records):
        n = int(rng.integers(1, max_tokens + 1))
        rollout = (-rng.exponential(2.0, n)).astype(np.float32)
        rollout[rng.integers(0, n, 2)] = rng.choice(SPECIAL, 2)
        trainer = rollout.copy()
        flip = rng.random(n) < 0.1  # some tokens differ in the last bit, like a native-path run
        trainer[flip] = np.nextafter(trainer[flip], np.float32(0))
        rid = RolloutRecord.make_id(step, f"p{i // 4}", i % 4)
        records.append(RolloutRecord(
            rid, step, f"p{i // 4}", i % 4, ENGINES[i % 2], step, FP,
            rng.integers(0, 151_000, int(rng.integers(1, 20))).tolist(), rng.integers(0, 151_000, n).tolist(),
            rollout.tolist(), float(rng.integers(0, 2)), "stop" if n < max_tokens else "length",
            {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_tokens": max_tokens, "seed": step * 100 + i}))
        recomputes.append(Recompute(rid, step, step, FP, trainer))
    summary = StepSummary(
        step=step, weight_version=step, compared_tokens=sum(r.n_tokens for r in records),
        mismatch_count=int(rng.integers(0, 50)), max_abs_diff=float(rng.random()), mean_abs_diff=1e-7,
        k3_kl=float("nan") if step % 5 == 4 else 1e-9, ratio_mean=1.0, ratio_min=0.999, ratio_max=1.001,
        ratio_outside=0.0, loss=-0.0 if step == 0 else float(rng.normal()), reward_mean=0.5, reward_std=0.5,
        clip_fraction=0.01, heldout_reward=None if step % 2 else 0.25 + step / 100,  # held out every 2 steps
        ops_paths={"attention": "strict", "linear": "native"}, contract_fingerprint=FP,
        timings={"rollout": 1.5, "update": float(step)},
        first_divergence=None if step % 2 else {"layer": "0", "op": "linear", "first_key": ["p0", 3]})
    version = WeightVersion(step + 1, step, checksum(step + 1), FP, 2000.0 + step)
    syncs = [SyncEvent(e, step + 1, checksum(step + 1), checksum(step + 1), 2000.0 + step, 2000.1 + step)
             for e in ENGINES]
    return FakeStep(summary, records, recomputes, [version], syncs)


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def assert_record_bitwise(got, want) -> None:
    """Same record, every float compared on its bits (-0.0 vs 0.0 counts)."""
    diffs = bitwise_differences(got, want)
    assert not diffs, f"{getattr(want, 'record_id', type(want).__name__)}: " + "; ".join(diffs)


def assert_step_complete(store, step: int) -> None:
    """The store holds exactly make_step(step): summary, every record and recompute, bit for bit."""
    want = make_step(step)
    got = {s.step: s for s in store.steps()}
    assert step in got, f"step {step} missing; store has {sorted(got)}"
    assert_record_bitwise(got[step], want.summary)
    records, recomputes = store.records(step), store.recomputes(step)
    assert len(records) == len(want.records), f"step {step}: {len(records)} of {len(want.records)} records"
    assert len(recomputes) == len(want.recomputes), f"step {step}: {len(recomputes)} recomputes"
    for a, b in zip(records + recomputes, want.records + want.recomputes):
        assert_record_bitwise(a, b)
