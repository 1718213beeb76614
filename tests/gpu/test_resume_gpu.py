"""A run on the GPU resumes through a replay: the steps committed after its last checkpoint are recomputed
and must come out bit for bit as stored (rlkit/loop.py), which asks the whole step (rollout, recompute,
update) to repeat exactly on this GPU. On the CPU the suite proves it (tests/runners/test_resume.py); on
CUDA the update's kernels are others (cuBLAS GEMM backward, the fused backward kernels, flash attention's
backward, whose dQ accumulation is known to be order-free in some builds), so it is checked here, for
both paths: a native run is resumed as often as a strict one.

qwen3-0.6b shape (its config and tokenizer from RLKIT_DATA, as the validation), 2 prompts x 4 samples,
256-token responses (several 128-key blocks a sequence, so attention's backward reduces over more than one
block), a checkpoint each step (the run keeps the newest two files); the reference to step 2's is dropped,
so the resume starts from step 1's checkpoint and replays step 2.
"""

import sqlite3

import pytest

from rlkit import loop
from rlkit.config import validation_0_6b
from rlkit.rundir import ResumeError
from rlkit.timeline.store import RunStore

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("path", ["strict", "native"])
def test_a_gpu_run_resumes_through_a_replayed_step(tmp_path, path):
    cfg = validation_0_6b(steps=3, prompts_per_step=2, samples_per_prompt=4, max_tokens=256, checkpoint_every=1,
                          path=path)
    run_dir = tmp_path / path
    loop.run(run_dir, cfg, progress=False).close()
    with RunStore.open(run_dir, readonly=True) as s:
        checksums = [v.checksum for v in s.versions()]
        rows = s._conn.execute("SELECT step, commit_seq, summary FROM steps ORDER BY step").fetchall()
        mismatches = [st.mismatch_count for st in s.steps()]
    assert len(set(checksums)) == 4, f"the weights must move at every step: {checksums}"
    if path == "strict":
        assert mismatches == [0, 0, 0], mismatches
    db = sqlite3.connect(run_dir / "run.sqlite")
    db.execute("DELETE FROM checkpoints WHERE step = 2")  # as if the run had stopped before step 2's save
    db.commit()
    db.close()
    try:
        loop.run(run_dir, resume=True, progress=False).close()
    except ResumeError as e:
        pytest.fail(f"{path}: the replayed steps did not repeat on this GPU: {e}")
    with RunStore.open(run_dir, readonly=True) as s:
        assert [v.checksum for v in s.versions()] == checksums
        assert s._conn.execute("SELECT step, commit_seq, summary FROM steps ORDER BY step").fetchall() == rows
