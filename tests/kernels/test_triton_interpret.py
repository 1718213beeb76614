"""The Triton kernels' logic on the CPU: Triton's interpreter (TRITON_INTERPRET=1) against the references.

TRITON_INTERPRET must be set before the kernels are decorated, so this module's one test runs the cases
(tests/kernels/triton_interpret_cases.py) in a fresh process with the variable set, and fails with their
output if any case fails. Inputs are fp32 (the interpreter's bf16 dot and bf16 rounding are wrong:
measured with Triton 3.6), so the fp32 kernels are compared with the references at fp32 tolerances; the
interpreter's bits say nothing about GPU bits (tests/gpu proves those on the H200). What is checked:
masks and tails (M, N, K not multiples of the tiles, a short last K step, a short last vocab chunk,
queries and keys not multiples of the blocks, NaN in unwritten cache slots), chunk and split boundaries,
that every launch configuration gives the same result, and determinism. Big tiles, small shapes: the
interpreter costs ~7 ms per program per loop step.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

CASES = Path(__file__).with_name("triton_interpret_cases.py")
SHARDS = 2
"""Processes running the cases at once (the interpreter is one thread each; both of the 2 cores work)."""


def test_kernels_under_the_interpreter():
    procs = []
    for i in range(SHARDS):
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore", RLKIT_TEST_SHARD=f"{i}/{SHARDS}")
        procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                       "-p", "tests.kernels.shard", str(CASES)],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:  # a shard past its timeout leaves no process behind
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        print(f"shard {i}/{SHARDS}:", out[-1500:])
        assert p.returncode == 0, f"interpreter cases (shard {i}/{SHARDS}) failed:\n{out[-6000:]}\n{err[-2000:]}"
        assert " passed" in out and "skipped" not in out, out[-2000:]
    counts = [re.search(r"(\d+) passed(?:, (\d+) deselected)?", out) for out, _ in outs]
    passed = [int(m[1]) for m in counts]
    collected = passed[0] + int(counts[0][2] or 0)
    assert sum(passed) == collected, f"the shards ran {passed} of {collected} cases"
