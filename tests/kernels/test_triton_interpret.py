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
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("triton_interpret_cases.py")


def test_kernels_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                         env=env, capture_output=True, text=True, timeout=900)
    print(res.stdout[-3000:])
    assert res.returncode == 0, f"interpreter cases failed:\n{res.stdout[-6000:]}\n{res.stderr[-2000:]}"
    assert " passed" in res.stdout and "skipped" not in res.stdout, res.stdout[-2000:]
