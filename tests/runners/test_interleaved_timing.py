"""lab/rl_step_ratio_h200.py --interleave: one run whose steps alternate strict and native through the
store's toggle requests, and the pair-by-pair ratios read from what each step recorded it ran."""

import importlib.util
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit import loop
from rlkit.config import lab_default
from rlkit.contract import OPS
from rlkit.timeline.store import StoreError

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "rl_step_ratio_h200.py"


@pytest.fixture(scope="module")
def ratio_script():
    spec = importlib.util.spec_from_file_location("rl_step_ratio_h200", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _step(n, path, step_s, mixed=False):
    paths = {op: path for op in OPS} | ({"attention": "native"} if mixed else {})
    return SimpleNamespace(step=n, ops_paths=paths, mismatch_count=0 if path == "strict" else 3,
                           compared_tokens=10, timings={"step_s": step_s, "rollout_s": step_s / 2,
                                                        "train_s": step_s / 4, "sync_s": 0.1})


def test_pairs_are_a_strict_step_and_the_native_step_right_after_it(ratio_script):
    steps = [_step(0, "strict", 9.0), _step(1, "strict", 9.0), _step(2, "native", 9.0),
             _step(3, "strict", 3.0), _step(4, "native", 2.0),       # a pair: 1.5
             _step(5, "strict", 2.2), _step(6, "strict", 2.2, True),  # a mixed step breaks the pair
             _step(7, "native", 2.0), _step(8, "strict", 2.4), _step(9, "native", 2.0)]  # 1.2
    result, ratio, pairs = ratio_script.interleaved_ratios(steps, warmup=3)
    assert [(p["strict_step"], p["native_step"]) for p in pairs] == [(3, 4), (8, 9)]
    assert ratio["step_s"] == pytest.approx((1.5 + 1.2) / 2)
    assert result["strict"]["steps_timed"] == 3 and result["native"]["steps_timed"] == 3
    # mismatches count every step of a path, the warm-up's too (as a two-run row counts step 0)
    assert result["native"]["mismatch_count"] == 12 and result["strict"]["mismatch_count"] == 0


def test_request_toggles_is_one_transaction_and_refuses_a_bad_op(tmp_path):
    store = loop.run(tmp_path / "r", lab_default(steps=1, prompts_per_step=1, samples_per_prompt=2,
                                                 max_tokens=2, warm_start_steps=0), progress=False)
    ids = store.request_toggles({op: "native" for op in OPS}, "test")
    assert len(ids) == len(OPS) and ids == sorted(ids)
    assert [(r.op, r.path) for r in store.pending_toggles()] == [(op, "native") for op in OPS]
    with pytest.raises(StoreError, match="toggle request refused"):
        store.request_toggles({"attention": "strict", "nonsense": "native"}, "test")
    assert len(store.pending_toggles()) == len(OPS)  # nothing of the refused request was added
    store.close()


def test_an_alternating_run_switches_every_op_each_step_and_keeps_strict_exact(tmp_path, ratio_script):
    cfg = lab_default(steps=6, prompts_per_step=2, samples_per_prompt=4, max_tokens=16, warm_start_steps=0)
    done = threading.Event()
    watcher = threading.Thread(target=ratio_script.alternate_paths, args=(tmp_path / "r", done), daemon=True)
    watcher.start()
    try:
        store = loop.run(tmp_path / "r", cfg, progress=False)
    finally:
        done.set()
        watcher.join(timeout=30)
    steps = store.steps()
    paths = [ratio_script.step_path(s) for s in steps]
    print("paths:", paths, "step seconds:", [round(s.timings["step_s"], 3) for s in steps])
    assert paths == ["strict", "strict", "native", "strict", "native", "strict"]
    for s in steps:
        if paths[s.step] == "strict":
            assert s.mismatch_count == 0 and s.max_abs_diff == 0.0, s
    events = store.toggles()
    assert {e.step for e in events} == {2, 3, 4, 5} and all(e.source == "rl_step_ratio --interleave" for e in events)
    result, ratio, pairs = ratio_script.interleaved_ratios(steps, warmup=3)
    assert [(p["strict_step"], p["native_step"]) for p in pairs] == [(3, 4)]
    assert set(ratio) == {"step_s", "rollout_s", "train_s", "sync_s"}
    store.close()
