"""`rlkit parity --rollout vllm`: the parity chain with vLLM (CPU build) as the rollout engine, from the
command line, and --json keeps stdout to the JSON object (vLLM logs to stdout; the CLI sends that away)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def test_parity_cli_with_vllm_rollout_is_bitwise():
    out = subprocess.run([sys.executable, "-m", "rlkit", "parity", "--rollout", "vllm", "--preset", "tiny",
                          "--path", "strict", "--prompts", "2", "--max-tokens", "12", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["rollout"] == "vllm"
    for name in ("trainer_batch_invariance", "trainer_vs_rollout_prefill", "decode_vs_rollout_prefill",
                 "trainer_vs_decode"):
        link = data["links"][name]
        assert link["mismatch_count"] == 0 and link["compared_tokens"] > 0, (name, link)
    assert data["links"]["trainer_vs_decode"]["compared_tokens"] == 24
