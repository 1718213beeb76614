"""The golden run (tests/golden/make.py): a fresh strict CPU run of the tiny preset reproduces the committed
per-step rows bit for bit (floats compared through `float.hex`, weights through their checksum, records
through a SHA-256 of their tokens and fp32 logprobs).

The run happens in a child process under rlkit.hardware.REPRODUCIBLE_CPU_ENV, which pins the instruction
set of MKL, oneDNN and ATen, so the bits do not depend on which CPU (Intel AVX-512 or AMD AVX2) runs it.
What they still depend on is the libraries themselves: the file names its torch / MKL / oneDNN builds.
On those builds every field must match. With other builds (a torch other than the pinned one) the
committed bits say nothing; the test then checks what holds on any build — the strict path's zero
mismatches, weights that move at every step, the same config — and that the run reproduces itself bit
for bit, and warns that the file is of other libraries.

A deliberate change of bits: `.venv/bin/python -m tests.golden.make`, and the reason in lab/LOG.md.
"""

import json
import warnings

from rlkit.config import RunConfig
from tests.golden.make import GOLDEN_CONFIG, GOLDEN_FILE, generate

REGENERATE = "regenerate with `.venv/bin/python -m tests.golden.make` and say why in lab/LOG.md"


def _row_differences(want: list[dict], got: list[dict]) -> list[str]:
    out = [f"{len(got)} steps, the file has {len(want)}"] if len(want) != len(got) else []
    for w, g in zip(want, got):
        out.extend(f"step {w['step']} {k}: file {w[k]} != run {g.get(k)}" for k in w if w[k] != g.get(k))
    return out


def test_golden_run_reproduces_bit_for_bit(tmp_path):
    golden = json.loads(GOLDEN_FILE.read_text())
    fresh = generate(tmp_path / "a")
    assert RunConfig.from_dict(golden["config"]) == GOLDEN_CONFIG == RunConfig.from_dict(fresh["config"]), (
        f"GOLDEN_CONFIG changed: {REGENERATE}")
    rows = fresh["rows"]
    assert [r["step"] for r in rows] == list(range(GOLDEN_CONFIG.steps))
    for r in rows:  # the strict path on any build: trainer == rollout on every token
        assert (r["mismatch_count"], r["max_abs_diff"]) == (0, "0x0.0p+0"), r
        assert r["compared_tokens"] > 0
    checksums = [fresh["initial_weight_checksum"]] + [r["weight_checksum"] for r in rows]
    assert len(set(checksums)) == len(checksums), f"the weights did not move at every step: {checksums}"

    if fresh["platform"] == golden["platform"]:
        problems = _row_differences(golden["rows"], rows)
        if fresh["initial_weight_checksum"] != golden["initial_weight_checksum"]:
            problems.insert(0, f"initial weights: file {golden['initial_weight_checksum']} != run "
                               f"{fresh['initial_weight_checksum']}")
        assert not problems, (f"the golden run moved ({len(problems)} fields; if on purpose, {REGENERATE}):\n"
                              + "\n".join(problems[:12]))
    else:
        warnings.warn(f"tests/golden/tiny_strict_run.json was made with {golden['platform']}; this machine has "
                      f"{fresh['platform']}: its bits were not compared (only the run with itself); {REGENERATE} "
                      f"if these are the project's pinned libraries now", stacklevel=1)
        again = generate(tmp_path / "b")
        problems = _row_differences(fresh["rows"], again["rows"])
        assert not problems and again["initial_weight_checksum"] == fresh["initial_weight_checksum"], (
            "the same strict run twice on this machine gave different bits:\n" + "\n".join(problems[:12]))
