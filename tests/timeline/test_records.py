"""Typed timeline records: dict/JSON round trips (fp32 logprobs bit for bit) and the checks they make."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlkit.divergence import logprob_divergence
from rlkit.rollout.types import GenerationResult
from rlkit.timeline import (CheckpointRef, Recompute, RecordError, RolloutRecord, StepSummary, SyncEvent,
                            ToggleEvent, ToggleRequest, WeightVersion)
from rlkit.timeline.records import bitwise_differences
from rlkit.types import SamplingParams
from tests.timeline.fakes import FP, SPECIAL, assert_record_bitwise, bits, make_step

SAMPLING = {"temperature": 0.7, "top_k": 20, "top_p": 0.95, "max_tokens": 8, "seed": 3}
NAN32 = np.float32("nan")  # the canonical quiet NaN, 0x7fc00000


def _record(logprobs, **kw) -> RolloutRecord:
    args = dict(record_id="s0/p0/0", step=0, prompt_id="p0", sample_index=0, engine_id="engine-0",
                weight_version=0, contract_fingerprint=FP, prompt_ids=[1, 2, 3],
                token_ids=list(range(10, 10 + len(logprobs))), rollout_logprobs=logprobs, reward=1.0,
                finish_reason="stop", sampling=SAMPLING)
    args.update(kw)
    return RolloutRecord(**args)


def every_record_type():
    s = make_step(4)
    return [s.summary, s.records[0], s.recomputes[0], s.versions[0], s.syncs[0],
            ToggleEvent(4, "attention", "native", 10.0, 11.5, "dashboard", "abc", request_id=7),
            ToggleEvent(4, "linear", "strict", 10.0, 10.0, "cli", "abd"),
            ToggleRequest(3, "logprob", "native", 12.0, "notebook"), CheckpointRef(4, "ckpt/step4", 99.0)]


@pytest.mark.parametrize("record", every_record_type(), ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_dict_and_json(record):
    assert_record_bitwise(type(record).from_dict(record.to_dict()), record)
    assert_record_bitwise(type(record).from_dict(json.loads(json.dumps(record.to_dict()))), record)


def test_fp32_logprobs_round_trip_bit_for_bit_with_special_values():
    values = np.concatenate([SPECIAL, [np.inf, NAN32, np.float32(-1.5)]]).astype(np.float32)
    rec = _record(values.tolist())
    for again in (RolloutRecord.from_dict(rec.to_dict()),
                  RolloutRecord.from_dict(json.loads(json.dumps(rec.to_dict())))):
        assert (bits(again.rollout_logprobs) == bits(values)).all()
        assert torch.equal(torch.signbit(torch.tensor(again.rollout_logprobs[:2])), torch.tensor([True, False]))


def test_tensors_and_arrays_are_accepted_as_their_fp32_values():
    t = torch.tensor([-0.0, -3.25, float("-inf")], dtype=torch.bfloat16)
    rec = _record(t)
    assert (bits(rec.rollout_logprobs) == t.float().numpy().view(np.uint32)).all()
    assert _record(np.array([-1.0, -2.0])).rollout_logprobs == [-1.0, -2.0]  # fp64 holding fp32 values
    assert Recompute("r", 0, 0, FP, torch.tensor([-0.5])).trainer_logprobs == [-0.5]


def test_a_value_fp32_cannot_hold_is_refused_not_rounded():
    with pytest.raises(RecordError, match=r"rollout_logprobs: 1 value\(s\) are not fp32 values \(first: \[1\] = 0.1\)"):
        _record([-1.0, 0.1])
    assert _record([float(np.float32(0.1))]).rollout_logprobs == [float(np.float32(0.1))]


def test_logprobs_must_line_up_with_tokens():
    with pytest.raises(RecordError, match="2 logprobs for 3 tokens"):
        _record([-1.0, -2.0], token_ids=[5, 6, 7])


@pytest.mark.parametrize("bad, match", [
    (dict(token_ids=[-1]), r"token ids must lie in \[0, 2147483647\]"),
    (dict(token_ids=[1.5]), "expected integer token ids"),
    (dict(step="3"), "RolloutRecord.step: expected an integer"),
    (dict(record_id=""), "record_id: must not be empty"),
    (dict(sampling={"temperature": 1.0}), r"sampling: missing \['top_k', 'top_p', 'max_tokens', 'seed'\]"),
])
def test_bad_fields_name_the_field(bad, match):
    with pytest.raises(RecordError, match=match):
        _record([-1.0], **bad)


def test_from_dict_names_missing_and_unknown_keys():
    d = WeightVersion(1, 0, "c", FP, 1.0).to_dict()
    d.pop("checksum")
    d["colour"] = "red"
    with pytest.raises(RecordError, match=r"missing \['checksum'\], unknown \['colour'\]"):
        WeightVersion.from_dict(d)


def test_sync_ok_only_when_checksums_match():
    assert SyncEvent("e0", 1, "aa", "aa", 0.0, 0.25).ok
    bad = SyncEvent("e0", 1, "aa", "ab", 0.0, 0.25)
    assert not bad.ok and bad.duration == 0.25


@pytest.mark.parametrize("op, path, match", [("attn", "native", "unknown op 'attn'; ops: rms_norm"),
                                             ("attention", "fast", "unknown path 'fast' for op attention")])
def test_toggles_only_name_ops_and_paths_of_the_contract(op, path, match):
    with pytest.raises(RecordError, match=match):
        ToggleRequest(1, op, path, 0.0, "dashboard")
    with pytest.raises(RecordError, match=match):
        ToggleEvent(0, op, path, 0.0, 0.0, "cli", "x")


def test_from_generation_takes_the_chosen_logprobs_and_the_sampling_config():
    result = GenerationResult("req", [1, 2], [7, 8], raw_logprobs=[-0.5, -0.0], processed_logprobs=[-0.25, 0.0],
                              finish_reason="length", weight_version=3, contract_fingerprint=FP,
                              engine_id="engine-1")
    cfg = SamplingParams(temperature=0.5, top_k=4, max_tokens=2, seed=9)
    rec = RolloutRecord.from_generation(result, step=3, prompt_id="p9", sample_index=1, reward=0.0, sampling=cfg)
    assert (rec.record_id, rec.weight_version, rec.engine_id) == ("s3/p9/1", 3, "engine-1")
    assert (bits(rec.rollout_logprobs) == bits([-0.5, -0.0])).all()
    assert rec.sampling == {"temperature": 0.5, "top_k": 4, "top_p": 1.0, "max_tokens": 2, "seed": 9}
    processed = RolloutRecord.from_generation(result, step=3, prompt_id="p9", sample_index=1, reward=0.0,
                                              sampling=cfg, logprobs="processed")
    assert processed.rollout_logprobs == [-0.25, 0.0]
    result.processed_logprobs = None
    with pytest.raises(RecordError, match="has no processed logprobs"):
        RolloutRecord.from_generation(result, step=3, prompt_id="p9", sample_index=1, reward=0.0,
                                      sampling=cfg, logprobs="processed")


def test_step_summary_builds_from_divergence_stats_and_checks_ops_paths():
    stats = logprob_divergence(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.5]))
    s = StepSummary.build(step=2, weight_version=2, divergence=stats, loss=0.1, reward_mean=0.5, reward_std=0.1,
                          clip_fraction=0.0, ops_paths={"attention": "native"}, contract_fingerprint=FP,
                          timings={"rollout": 1}, first_divergence=None)
    assert (s.compared_tokens, s.mismatch_count, s.max_abs_diff) == (2, 1, 0.5)
    assert not s.bitwise_equal and s.timings == {"rollout": 1.0}
    with pytest.raises(RecordError, match="StepSummary.ops_paths: unknown op 'mlp'"):
        StepSummary.from_dict(dict(s.to_dict(), ops_paths={"mlp": "strict"}))


def test_bitwise_differences_sees_sign_flips_that_equality_misses():
    a = _record([-0.0, -1.0, float("nan")], reward=0.0)
    b = _record([0.0, -1.0, float("nan")], reward=-0.0)
    diffs = bitwise_differences(a, b)
    assert diffs == ["rollout_logprobs: 1 of 3 values differ in bits, first [0]: -0.0 vs 0.0",
                     "reward: 0.0 vs -0.0"]
    assert bitwise_differences(a, _record([-0.0, -1.0, float("nan")], reward=0.0)) == []
    assert bitwise_differences(a, Recompute("r", 0, 0, FP, [])) == [
        "record types differ: RolloutRecord vs Recompute"]
