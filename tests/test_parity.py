"""The parity chain, the top-level proof: the logprob the rollout recorded while decoding equals, bit for
bit, the logprob the trainer recomputes.

Why the three links prove it: (1) the trainer's forward is the same whatever batch it sits in, so
"the trainer's logprob of this token" is one well-defined number; (2) the trainer's full-sequence
forward equals the rollout engine's prefill of the same sequence through its paged KV cache; (3) the
engine's token-by-token decode equals its own prefill of the whole sequence. Chained:
decode == prefill == trainer, whatever the batch on either side. The end-to-end comparison
(trainer_vs_decode) checks the conclusion directly. The native path runs the same chain as a negative
control.

Sizes: a contract with split 64 / block 16 and pages of 16 positions makes DAPO prompts (about 150-250
tokens with the template) cross several KV-page, attention-block and split boundaries; engine settings
vary the batch compositions (sequences per step, chunked-prefill budget).
"""

import json
import subprocess
import sys

import pytest
import torch

from rlkit import NumericsContract
from rlkit.bitwise import assert_bitwise_equal
from rlkit.contract import AttentionSpec
from rlkit.parity import ParitySettings, parity_settings, run_parity
from rlkit.rollout import EngineConfig
from tests.negative import require_native_difference

SMALL_SPLITS = NumericsContract.default().replace(attention=AttentionSpec(split_size=64, block_size=16))
COMPOSITIONS = {
    "4 seqs, 64-token steps": EngineConfig(page_size=16, max_num_seqs=4, max_batch_tokens=64),
    "2 seqs, 40-token steps": EngineConfig(page_size=16, max_num_seqs=2, max_batch_tokens=40),
    "3 seqs, 128-token steps": EngineConfig(page_size=8, max_num_seqs=3, max_batch_tokens=128),
}
LINKS = ["trainer_batch_invariance", "trainer_vs_rollout_prefill", "decode_vs_rollout_prefill", "trainer_vs_decode"]


def settings(**kw) -> ParitySettings:
    base = dict(model="tiny", prompts=4, max_tokens=24, contract=SMALL_SPLITS, seed=3, locate=False)
    base.update(kw)
    return parity_settings(**base)


@pytest.mark.parametrize("dtype, temperature, top_p, composition", [
    ("bfloat16", 1.0, 1.0, "4 seqs, 64-token steps"),
    ("bfloat16", 0.7, 0.9, "2 seqs, 40-token steps"),
    ("float32", 1.0, 1.0, "3 seqs, 128-token steps"),
    ("float32", 0.7, 0.9, "4 seqs, 64-token steps"),
])
def test_strict_parity_chain_is_bitwise(dtype, temperature, top_p, composition):
    report = run_parity(settings(dtype=dtype, temperature=temperature, top_p=top_p,
                                 engine=COMPOSITIONS[composition]), log=lambda _m: None)
    names = LINKS + (["trainer_vs_decode_processed"] if temperature != 1.0 or top_p != 1.0 else [])
    for name in names:
        actual, expected = report.pairs[name]
        assert_bitwise_equal(actual, expected, f"{name} ({dtype}, T={temperature}, top_p={top_p}, {composition})")
    assert report.links["trainer_vs_decode"].compared_tokens >= 4 * 10
    assert report.first_divergence is None


def test_default_contract_crosses_a_split_boundary():
    """The default contract (v4: split 512, block 64): a long DAPO prompt plus its response passes the
    first split (prompts of 200 and 210 tokens + 320), so decode folds two split states as the prefill does."""
    split = NumericsContract.default().attention.split_size
    report = run_parity(parity_settings(model="tiny", prompts=4, max_tokens=320, seed=1, locate=False,
                                        engine=COMPOSITIONS["4 seqs, 64-token steps"]), log=lambda _m: None)
    assert max(report.sequence_lengths) > split, (split, report.sequence_lengths)
    for name in LINKS:
        assert_bitwise_equal(*report.pairs[name], name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_path_mismatches(dtype):
    """Negative control. fp32: MKL's GEMM and SDPA change bits with the batch, so decode and trainer
    disagree on many tokens (the trainer's two packings happen to agree: every GEMM there has M >= 2,
    and MKL's M-dependence measured here is between M = 1 and M >= 2). bf16 on the CPU: oneDNN's bf16 GEMM is batch-invariant at the tiny preset's
    K <= 384 and bf16 rounding hides most of SDPA's decode-vs-prefill differences; the activations still
    differ (the locator finds them), and the count of logprob mismatches is printed."""
    report = run_parity(settings(path="native", dtype=dtype, locate=True, max_tokens=32,
                                 engine=COMPOSITIONS["4 seqs, 64-token steps"]), log=lambda _m: None)
    e2e = report.links["trainer_vs_decode"]
    measured = (f"native {dtype}: trainer_vs_decode {e2e.mismatch_count}/{e2e.compared_tokens} mismatches, "
                f"max |diff| {e2e.max_abs_diff:.3g}; first divergence {report.first_divergence}")
    if dtype == "float32":
        require_native_difference(e2e.mismatch_count, measured)
    else:  # bf16 may round every logprob difference away: the located activation difference counts too
        require_native_difference(e2e.mismatch_count + (report.first_divergence is not None), measured)


@pytest.mark.parametrize("op, expected_site", [("attention", "self_attn.attn"), ("linear", "self_attn.q_proj")])
def test_locator_names_the_one_native_op(op, expected_site):
    report = run_parity(settings(ops={op: "native"}, dtype="float32", locate=True, max_tokens=16), log=lambda _m: None)
    fd = report.first_divergence
    assert fd is not None, f"with {op} native, no divergence was located"
    assert (fd["layer"], fd["op"], fd["site"]) == ("0", op, expected_site), fd


def test_cli_json_and_bad_arguments(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlkit", "parity", "--preset", "tiny", "--path", "strict",
                          "--prompts", "2", "--max-tokens", "8", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["contract"] == NumericsContract.default().fingerprint() and data["path"] == "strict"
    e2e = data["links"]["trainer_vs_decode"]
    assert e2e["mismatch_count"] == 0 and e2e["compared_tokens"] == 16 and data["first_divergence"] is None
    for bad, needle in [(["--top-p", "1.5"], "top_p"), (["--ops", "attention=fast"], "paths.attention"),
                        (["--prompts", "0"], "expected an integer >= 1"), (["--device", "cuda"], "CUDA")]:
        res = subprocess.run([sys.executable, "-m", "rlkit", "parity", *bad], capture_output=True, text=True)
        assert res.returncode == 2, (bad, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr, res.stderr
