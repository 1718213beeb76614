"""rlkit.divergence on hand-made tensors: every statistic against a value computed by hand.

rollout = [-1, -2, -0.5, +0], trainer = [-1, -1.5, -0.75, -0] (all exact in fp32), so
delta = trainer - rollout = [0, 0.5, -0.25, -0]:
- mismatch_count 3: the two changed values and the signed zero (a bitwise comparison);
- max |delta| 0.5, mean |delta| (0.5 + 0.25) / 4 = 0.1875;
- ratio = exp(delta) = [1, e^0.5, e^-0.25, 1]: mean (2 + e^0.5 + e^-0.25) / 4, min e^-0.25, max e^0.5,
  outside [0.8, 1.2]: e^0.5 = 1.649 and e^-0.25 = 0.779, so 2 of 4;
- K3 = mean(ratio - 1 - delta) = ((e^0.5 - 1.5) + (e^-0.25 - 0.75)) / 4.
"""

import math

import pytest
import torch

from rlkit.divergence import (ActivationRecorder, DivergenceStats, FingerprintMismatch, _Call, check_fingerprints,
                              first_divergence, flatten, logprob_divergence, op_site)

ROLLOUT = [-1.0, -2.0, -0.5, 0.0]
TRAINER = [-1.0, -1.5, -0.75, -0.0]
E_HALF, E_MINUS_QUARTER = math.exp(0.5), math.exp(-0.25)


def test_stats_match_the_hand_computed_values():
    s = logprob_divergence(torch.tensor(ROLLOUT), torch.tensor(TRAINER))
    assert (s.compared_tokens, s.mismatch_count) == (4, 3)
    assert (s.max_abs_diff, s.mean_abs_diff) == (0.5, 0.1875)  # exact: sums of powers of two
    assert s.ratio_outside == 0.5
    assert s.ratio_max == pytest.approx(E_HALF, rel=1e-15)
    assert s.ratio_min == pytest.approx(E_MINUS_QUARTER, rel=1e-15)
    assert s.ratio_mean == pytest.approx((2 + E_HALF + E_MINUS_QUARTER) / 4, rel=1e-15)
    assert s.k3_kl == pytest.approx(((E_HALF - 1.5) + (E_MINUS_QUARTER - 0.75)) / 4, rel=1e-12)


def test_sequences_as_lists_flatten_in_order():
    per_seq_rollout = [torch.tensor(ROLLOUT[:1]), ROLLOUT[1:3], torch.tensor(ROLLOUT[3:]).double()]
    per_seq_trainer = [TRAINER[:2], torch.tensor(TRAINER[2:])]
    assert logprob_divergence(per_seq_rollout, per_seq_trainer) == logprob_divergence(
        torch.tensor(ROLLOUT), torch.tensor(TRAINER))
    flat = flatten(per_seq_rollout)
    assert flat.dtype == torch.float32 and flat.tolist() == ROLLOUT


def test_identical_logprobs_give_zero_mismatch_and_ratio_one():
    x = torch.tensor([-3.25, -0.0, -1e-8, -17.5])
    s = logprob_divergence(x, x.clone())
    assert s == DivergenceStats(4, 0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0)


def test_one_ulp_is_a_mismatch():
    a = torch.tensor([-1.0])
    b = torch.nextafter(a, torch.tensor([0.0]))  # one fp32 ulp towards zero: 2^-24 here
    s = logprob_divergence(a, b)
    assert s.mismatch_count == 1 and s.max_abs_diff == 2.0 ** -24


def test_non_finite_values():
    # -inf recorded, -1 recomputed: a mismatch whose difference is not finite; the ratio is clamped
    s = logprob_divergence(torch.tensor([-math.inf]), torch.tensor([-1.0]))
    assert (s.mismatch_count, s.max_abs_diff, s.mean_abs_diff, s.k3_kl) == (1, math.inf, 0.0, 0.0)
    assert (s.ratio_mean, s.ratio_min, s.ratio_max, s.ratio_outside) == (1.0, 1.0, 1.0, 1.0)
    # the same -inf (or NaN) on both sides is no mismatch; finite tokens beside it still count
    s = logprob_divergence(torch.tensor([-math.inf, math.nan, -1.0]), torch.tensor([-math.inf, math.nan, -1.5]))
    assert (s.mismatch_count, s.max_abs_diff, s.mean_abs_diff) == (1, 0.5, 0.5)  # over the finite differences
    assert s.ratio_min == s.ratio_max == pytest.approx(math.exp(-0.5), rel=1e-15)
    assert s.ratio_outside == pytest.approx(1 / 3)  # the NaN ratios of the non-finite tokens are not outside


def test_empty_and_misaligned_inputs():
    assert logprob_divergence([], []) == DivergenceStats.empty()
    with pytest.raises(ValueError, match="rollout has 3 tokens, trainer 2"):
        logprob_divergence(torch.zeros(3), torch.zeros(2))


def test_records_of_different_contracts_are_never_compared():
    check_fingerprints("abc", "abc")
    with pytest.raises(FingerprintMismatch, match="refusing to compare: rollout contract abc != trainer contract xyz"):
        check_fingerprints("abc", "xyz")


def test_op_site_names_layer_and_op():
    assert op_site("model.layers.3.self_attn.q_proj") == ("3", "self_attn.q_proj")
    assert op_site("model.layers.12.mlp.act") == ("12", "mlp.act")
    assert op_site("model.norm") == ("final", "norm")


def _recording(outputs: dict[str, torch.Tensor], keys) -> ActivationRecorder:
    rec = ActivationRecorder(model=None)
    for name, out in outputs.items():
        op = "rms_norm" if name.endswith("norm") else "linear"
        rec.calls.append(_Call(name, op, out, list(keys)))
        rec.order.append(name)
    return rec


def test_first_divergence_is_the_first_op_in_execution_order_that_differs():
    keys = [("s0", 5), ("s0", 6), ("s1", 5)]
    norm = torch.arange(12.0).reshape(3, 4)
    proj = torch.ones(3, 2)
    later = torch.zeros(3, 2)
    a = _recording({"model.layers.0.input_layernorm": norm, "model.layers.0.self_attn.q_proj": proj,
                    "model.layers.1.self_attn.q_proj": later}, keys)
    proj_b, later_b = proj.clone(), later.clone()
    proj_b[1, 0] += 0.25   # one element of row ("s0", 6) differs here
    proj_b[2] = -proj_b[2]  # and both elements of row ("s1", 5)
    later_b[0, 0] = 9.0     # a later op differs too: not the first
    b = _recording({"model.layers.0.input_layernorm": norm.clone(), "model.layers.0.self_attn.q_proj": proj_b,
                    "model.layers.1.self_attn.q_proj": later_b}, keys)
    fd = first_divergence(a, b)
    assert fd is not None
    assert (fd.layer, fd.op, fd.site, fd.module) == ("0", "linear", "self_attn.q_proj", "model.layers.0.self_attn.q_proj")
    assert (fd.differing_rows, fd.compared_rows, fd.differing_elements) == (2, 3, 3)
    assert fd.max_abs_diff == 2.0 and fd.first_key == ("s0", 6)
    assert fd.to_dict()["first_key"] == ["s0", 6]
    # restricted to the rows where the q_proj agrees, the later op is the first divergence
    later_only = first_divergence(a, b, keys=[("s0", 5)])
    assert (later_only.layer, later_only.differing_rows, later_only.max_abs_diff) == ("1", 1, 9.0)
    assert first_divergence(a, a) is None
