"""lab/layouts_2gpu.py --dry-run: the two-GPU script of issue 18 runs its own code on the CPU before any
device time is spent on it (gloo instead of NCCL, the tiny preset; the Ray phase on a local Ray cluster
that declares two GPUs, so the RayRunner's GPU placement runs as it will on `nvidia-h200-x2`).

Each phase runs as its own subprocess, as the device command runs it, and is judged from the JSON the
script writes: the layouts phase's strict cells (trainer TP 2 and CP 2 against rollout TP 1 and TP 2,
raw and processed) have 0 mismatches on every trainer rank; the Ray phase's CP-2 trainer and TP-2 engine
have 0 mismatches at every step, every sync is acknowledged, and each group's ranks got distinct GPUs.
About 1 and 2 minutes on the shared 2 cores (Ray's start is ~20 s of the second).
Run: `.venv/bin/python -m pytest -q -s tests/train/test_layouts_2gpu_dry_run.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.negative import require_native_difference

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "layouts_2gpu.py"

pytestmark = pytest.mark.megatron


def _dry_run(out: Path, phase: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--phases", phase, "--out", str(out),
                           "--work", str(out / "work")], capture_output=True, text=True, timeout=600, cwd=REPO)
    print(done.stdout)
    name = "layouts-2gpu.json" if phase == "layouts" else "ray-cp2.json"
    assert (out / name).is_file(), f"exit {done.returncode}, no {name}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads((out / name).read_text()), done.stdout + f"\nexit {done.returncode}"


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> tuple[dict, str]:
    return _dry_run(tmp_path_factory.mktemp("layouts"), "layouts")


def test_layouts_phase_strict_cells_have_zero_mismatches(layouts):
    got, log = layouts
    assert got["layouts"] == ["2x1x1", "1x2x1"] and got["model"] == "tiny"
    strict = [c for c in got["cells"] if c["path"] == "strict"]
    assert len(strict) == 2 * 2 * 2  # two trainer layouts x rollout TP 1, 2 x raw, processed
    for cell in strict:
        for rank, r in enumerate(cell["ranks"]):
            assert r["differing"] == 0, (f"trainer {cell['trainer']} rank {rank} vs rollout TP{cell['rollout_tp']} "
                                         f"({cell['semantics']}): {r['differing']} of {r['tokens']} differ, max "
                                         f"|delta| {r['max_abs_diff']}, first {r['first']}")
    for check in got["checks"]:
        assert check.get("ok", True), check
    assert got["ok"] and "exit 0" in log, log[-2000:]
    assert "| 1 x 2 x 1 | 0 / " in got["tables"]["strict_raw"]


def test_layouts_phase_native_control(layouts):
    """The native cells beside them: measured (tests/negative.py), as in the gloo layout matrix."""
    got, _ = layouts
    require_native_difference(got["native_differing_tokens"], f"native trainer_vs_decode:\n"
                                                              f"{got['tables']['native_raw']}")


@pytest.mark.ray
def test_ray_phase_places_a_cp2_trainer_on_two_gpus_with_zero_mismatches(tmp_path):
    got, log = _dry_run(tmp_path, "ray")
    steps = got["steps"]
    assert [s["step"] for s in steps] == [0, 1]
    assert all(s["mismatch"] == 0 and s["compared_tokens"] > 0 for s in steps), steps
    assert got["syncs_ok"] and got["distinct_weight_checksums"] == 3, got
    ids = got["placement"]["ray_gpu_ids"]
    assert ids == {"trainer": [["0"], ["1"]], "engine-0": [["0"], ["1"]]}, ids  # one of each group a GPU
    assert got["placement"]["share"] == 0.5 and got["config"]["trainer_cp"] == 2
    assert got["placement"]["weights"] == "object store"  # CPU tensors (and a 2-rank trainer): no CUDA IPC
    assert got["ok"] and "exit 0" in log, log[-2000:]
